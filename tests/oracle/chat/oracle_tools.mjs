// Chat-format oracle for tools, tool calls, tool results and thinking: `lily render-chat` object lines vs real Jinja.
//
//   node oracle_tools.mjs --lily BUILD/lily --template tests/fixtures/qwen3.6-chat_template.jinja
//                         [--engine hf|jinja2] [--count 600] [--seed 20260516] [--show 5]
//
// Every case is one object line {"messages", "tools", "chat_template_kwargs"} in OpenAI's
// shapes (arguments as JSON strings, `developer`, `reasoning`, content parts, null contents).
// The expected answer is the engine's rendering of the same conversation in the template's
// shapes: developer -> system, `reasoning` -> reasoning_content (when reasoning_content is not
// a string), arguments -> the object the string encodes, and, with thinking disabled, Lily's
// nothink history rewrite (docs/chat-format.md §3); kwargs enable_thinking=false when disabled,
// undefined or true when enabled, preserve_thinking as given. Or an error: Lily's input rules
// (fixed cases) or the template's raise_exception() text.
//
// --engine hf (chat_oracle_tools, required): @huggingface/jinja. Seeded values stay away from
//   what the library renders unlike Python (docs/chat-format.md §8): integral and exponent-form
//   floats, integers past 2^53, integer-like object keys, and the whitespace of oracle.mjs.
//   The DIVERGENCES cases pin those: Jinja2's answer is the library's with one substring
//   replaced, and the harness confirms the library still differs.
// --engine jinja2 (chat_oracle_tools_jinja2): Python Jinja2 via render_jinja2.py with
//   transformers' tojson; seeded cases then use every value above.
import fs from "node:fs";

import { EMPTY_THINK, esc, fail, hfEngine, jinja2Engine, judge, makeRng, runLily } from "./common.mjs";

function parseArgs(argv) {
  const opts = { engine: "hf", count: 600, seed: 20260516, show: 5, python: "python3" };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, "");
    const value = argv[++i];
    if (value === undefined) fail(`option --${key} needs a value`);
    if (["count", "seed", "show"].includes(key)) opts[key] = Number(value);
    else if (["lily", "template", "engine", "python"].includes(key)) opts[key] = value;
    else fail(`unknown option --${key}`);
  }
  if (!opts.lily || !opts.template) fail("usage: node oracle_tools.mjs --lily PATH --template PATH [--engine hf|jinja2]");
  if (!["hf", "jinja2"].includes(opts.engine)) fail(`--engine must be hf or jinja2, not ${opts.engine}`);
  return opts;
}

// ---- JSON text with exact numbers and key order ---------------------------------------------

// A JSON number written exactly as `text` (JavaScript would print 1.0 as 1).
class Num {
  constructor(text) { this.text = text; }
}
// A JSON object as an ordered list of entries (JavaScript objects put integer-like keys first).
class Obj {
  constructor(entries) { this.entries = entries; }
}

// JSON text of a tree of plain values, Num and Obj. `spaced` writes Python's separators.
function toText(v, spaced = false) {
  const [item, key] = spaced ? [", ", ": "] : [",", ":"];
  if (v instanceof Num) return v.text;
  if (v instanceof Obj) return "{" + v.entries.map(([k, x]) => JSON.stringify(k) + key + toText(x, spaced)).join(item) + "}";
  if (Array.isArray(v)) return "[" + v.map((x) => toText(x, spaced)).join(item) + "]";
  if (v !== null && typeof v === "object") {
    return "{" + Object.entries(v).filter(([, x]) => x !== undefined).map(([k, x]) => JSON.stringify(k) + key + toText(x, spaced)).join(item) + "}";
  }
  return JSON.stringify(v);
}

// ---- seeded generator -----------------------------------------------------------------------

// Whitespace all engines trim alike, and what only Python trims (see oracle.mjs).
const WS_COMMON = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028"];
const WS_DIVERGENT = ["\u0085", "\u001c", "\u001f", "\ufeff"];
const WORDS = ["hello", "Paris", "weather", "42", "x", "the quick brown fox", "What is 2+2?", "ok",
  "a-b_c", "tabs\tinside", "line\nbreak", "{\"json\": \"looking\"}", "[1, 2]", "null", "true", "3.0"];
const UNICODE = ["é", "日本語", "😀", "👩‍💻", "עברית", "مرحبا", "e\u0301", "\u200b", "Ω≈ç√", "\u0000",
  "\u0001", "\u001b", "\u007f", "\u00ad", "\u2029"];
const MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=f>", "<parameter=x>",
  "</parameter>", "<tool_response>", "</tool_response>", "<|im_end|>", "{{ x }}", "\\", "\"", "'"];
const FUNCTIONS = ["get_weather", "search", "run_python", "read_file", "send_email", "calc", "lookup_user",
  "translate", "list_files", "create_event", "db.query", "ns_tool-2"];
const KEYS = ["city", "query", "code", "path", "to", "subject", "body", "limit", "units", "options",
  "filters", "date", "tags", "verbose", "lang", "日本語", "with space", "a-b.c", "q", "x", "Z"];
// Keys JavaScript objects reorder or treat specially; Python keeps them in place.
const KEYS_PYTHON = ["0", "10", "7", "", "__proto__"];

function generator(seed, python) {
  const rng = makeRng(seed);
  const ws = python ? WS_COMMON.concat(WS_DIVERGENT) : WS_COMMON;
  const edge = (p) => (rng.chance(p) ? Array.from({ length: 1 + rng.int(2) }, () => rng.pick(ws)).join("") : "");
  function body(markup = true) {
    let out = "";
    for (let n = 1 + rng.int(6); n > 0; n--) {
      const r = rng();
      if (r < 0.55) out += rng.pick(WORDS);
      else if (r < 0.75) out += rng.pick(UNICODE);
      else if (r < 0.87 && markup) out += rng.pick(MARKUP);
      else out += rng.pick(ws);
      if (rng.chance(0.5)) out += " ";
    }
    return out;
  }
  const text = () => (rng.chance(0.08) ? "" : edge(0.3) + body() + edge(0.3));
  // Whether the conversation being generated holds a value only Python keeps exactly.
  let pythonOnly = false;
  const key = () => {
    if (python && rng.chance(0.1)) { pythonOnly = true; return rng.pick(KEYS_PYTHON); }
    return rng.pick(KEYS);
  };
  // Distinct keys, in generation order.
  function keys(n) {
    const out = [];
    for (let tries = 0; out.length < n && tries < 20; tries++) {
      const k = key();
      if (!out.includes(k)) out.push(k);
    }
    return out;
  }

  // Numbers. The hf engine gets JSON.parse'd values: integers within 2^53, and floats that
  // JavaScript and Python both print in fixed notation with the same shortest digits
  // (non-integral, 1e-4 <= |x| < 1e16).
  function portableFloat() {
    for (;;) {
      const v = (rng.chance(0.3) ? -1 : 1) * (1 + rng()) * 10 ** (rng.int(18) - 4);
      const t = Number(v.toPrecision(1 + rng.int(17)));
      if (!Number.isInteger(t) && Math.abs(t) >= 1e-4 && Math.abs(t) < 1e16) return new Num(String(t));
    }
  }
  const PYTHON_FLOATS = ["1.0", "-1.0", "0.0", "-0.0", "100.0", "1e-05", "1E-7", "2.5e-05", "1e16", "1e+16",
    "1.5E300", "5e-324", "1.7976931348623157e308", "2.50", "0.5e1", "1e22", "123456789012345678.0", "0.1", "1e15"];
  const PYTHON_INTS = ["9007199254740993", "-9223372036854775808", "9223372036854775807", "18446744073709551615", "-0"];
  function number() {
    const r = rng();
    if (r < 0.35) return rng.int(2000) - 1000;
    if (r < 0.45) return rng.pick([0, 1, -1, 2 ** 31, -(2 ** 31), 2 ** 53 - 1]);
    if (python && r < 0.6) { pythonOnly = true; return new Num(rng.chance(0.7) ? rng.pick(PYTHON_FLOATS) : rng.pick(PYTHON_INTS)); }
    if (python && r < 0.7) {
      // Integer literals beyond 64 bits are the one thing lily reads differently (as floats;
      // docs/chat-format.md §8), so such values are written in exponent form.
      pythonOnly = true;
      const v = (rng() - 0.5) * 10 ** (rng.int(60) - 30);
      const t = String(v);
      return new Num(/^-?\d+$/.test(t) && Math.abs(v) >= 2 ** 63 ? v.toExponential() : t);
    }
    return portableFloat();
  }
  function value(depth) {
    const r = rng();
    if (r < 0.35) return text();
    if (r < 0.55) return number();
    if (r < 0.62) return rng.chance(0.5);
    if (r < 0.67) return null;
    if (depth <= 0 || r < 0.8) return depth <= 0 ? text() : Array.from({ length: rng.int(4) }, () => value(depth - 1));
    return new Obj(keys(rng.int(4)).map((k) => [k, value(depth - 1)]));
  }

  // An OpenAI tool with a JSON Schema; keys sometimes in an unusual order, extra keys kept.
  function schema(depth) {
    const r = rng();
    const entries = [];
    if (r < 0.3) entries.push(["type", "string"]);
    else if (r < 0.45) entries.push(["type", rng.pick(["integer", "number"])], ["minimum", number()]);
    else if (r < 0.55) entries.push(["type", "boolean"]);
    else if (r < 0.7 || depth <= 0) entries.push(["type", "string"], ["enum", [text(), text()]]);
    else if (r < 0.85) entries.push(["type", "array"], ["items", schema(depth - 1)]);
    else {
      const props = keys(1 + rng.int(3));
      entries.push(["type", "object"], ["properties", new Obj(props.map((k) => [k, schema(depth - 1)]))]);
    }
    if (rng.chance(0.4)) entries.push(["description", text()]);
    if (rng.chance(0.15)) entries.push(["default", value(1)]);
    if (rng.chance(0.2)) entries.reverse();
    return new Obj(entries);
  }
  function tool(name) {
    const props = keys(rng.int(5));
    const parameters = new Obj([["type", "object"], ["properties", new Obj(props.map((k) => [k, schema(2)]))],
      ["required", props.filter(() => rng.chance(0.5))]]);
    if (rng.chance(0.2)) parameters.entries.push(["additionalProperties", false]);
    const fn = [["name", name]];
    if (rng.chance(0.8)) fn.push(["description", text()]);
    fn.push(["parameters", parameters]);
    if (rng.chance(0.1)) fn.push(["strict", true]);
    if (rng.chance(0.2)) fn.reverse();
    const entries = [["type", "function"], ["function", new Obj(fn)]];
    if (rng.chance(0.2)) entries.reverse();
    return new Obj(entries);
  }

  // Content: a string, or text parts (the template concatenates them before trimming), or
  // (assistant and tool only) null, absent or "".
  function content(s, nullable) {
    const r = rng();
    if (nullable && r < 0.12) return null;
    if (nullable && r < 0.17) return undefined;
    if (r < 0.3 && s.length > 0) {
      // Cut between code points (a UTF-16 cut could split a surrogate pair).
      const points = Array.from(s);
      const cut = rng.int(points.length + 1);
      return [{ type: "text", text: points.slice(0, cut).join("") }, { type: "text", text: points.slice(cut).join("") }];
    }
    return s;
  }
  // @huggingface/jinja's lstrip('\n') strips all whitespace (oracle.mjs): keep "</think>" + '\n'*
  // followed by other whitespace out of hf cases.
  function portable(s) {
    if (python) return s;
    const re = /(<\/think>\n*)[^\S\n]/u;
    while (re.test(s)) s = s.replace(re, "$1");
    return s;
  }
  function assistantText() {
    const r = rng();
    if (r < 0.5) return portable(text());
    if (r < 0.75) return portable(`${edge(0.2)}<think>${rng.pick(["", "\n", "\n\n"])}${text()}${rng.pick(["", "\n"])}</think>${rng.pick(["", "\n", "\n\n"])}${text()}`);
    if (r < 0.85) return portable(EMPTY_THINK + text());
    return portable(text() + rng.pick(["</think>", "<think>"]) + text());
  }
  // The reasoning fields of an assistant message.
  function reasoning(m) {
    const r = rng();
    const s = () => (rng.chance(0.15) ? rng.pick(["", " ", "\n"]) : text());
    if (r < 0.3) m.reasoning_content = s();
    else if (r < 0.45) m.reasoning = s();
    else if (r < 0.52) { m.reasoning_content = s(); m.reasoning = s(); }
    else if (r < 0.6) { m.reasoning_content = null; if (rng.chance(0.5)) m.reasoning = s(); }
  }
  function toolCall(names, k) {
    const args = new Obj(keys(rng.int(5)).map((k2) => [k2, value(2)]));
    const fn = { name: rng.chance(0.9) ? rng.pick(names) : rng.pick(FUNCTIONS) };
    const form = rng();
    // On the wire arguments are a JSON string; its spacing must not matter. Some clients send
    // the object itself; an absent `arguments` renders no parameters.
    if (form < 0.6) fn.arguments = toText(args);
    else if (form < 0.8) fn.arguments = " " + toText(args, true) + "\n";
    else if (form < 0.95) fn.arguments = args;
    else if (args.entries.length === 0) delete fn.arguments;
    else fn.arguments = toText(args);
    const call = { id: `call_${k}`, type: "function", function: fn };
    if (rng.chance(0.1)) delete call.type;
    return { call, args: fn.arguments === undefined ? undefined : args };
  }

  return function conversation() {
    pythonOnly = false;
    const messages = [];
    const calls = new Map();  // call object -> its parsed arguments (for the template's shape)
    const toolCount = rng.chance(0.15) ? 0 : 1 + rng.int(4);
    const shuffled = FUNCTIONS.slice();
    for (let i = shuffled.length - 1; i > 0; i--) {
      const j = rng.int(i + 1);
      [shuffled[i], shuffled[j]] = [shuffled[j], shuffled[i]];
    }
    const names = shuffled.slice(0, Math.max(1, toolCount));
    const tools = names.slice(0, toolCount).map(tool);
    if (rng.chance(0.55)) messages.push({ role: rng.chance(0.3) ? "developer" : "system", content: content(text(), false) });
    let k = 0;
    const turns = 1 + rng.int(3);
    for (let t = 0; t < turns; t++) {
      messages.push({ role: "user", content: content(rng.chance(0.06) ? `<tool_response>${text()}</tool_response>` : text(), false) });
      const steps = rng.int(4);
      for (let step = 0; step < steps; step++) {
        const m = { role: "assistant" };
        const c = rng.chance(0.45) ? rng.pick([null, undefined, ""]) : assistantText();
        m.content = typeof c === "string" ? content(c, false) : c;
        if (m.content === undefined) delete m.content;
        reasoning(m);
        const n = 1 + (rng.chance(0.3) ? rng.int(3) : 0);
        m.tool_calls = [];
        for (let j = 0; j < n; j++) {
          const { call, args } = toolCall(names, k++);
          calls.set(call, args);
          m.tool_calls.push(call);
        }
        messages.push(m);
        const results = rng.chance(0.85) ? n : 1 + rng.int(3);
        for (let j = 0; j < results; j++) {
          const r = { role: "tool", tool_call_id: m.tool_calls[Math.min(j, n - 1)].id, content: content(rng.chance(0.2) ? toText(value(2), true) : text(), true) };
          if (r.content === undefined) delete r.content;
          messages.push(r);
        }
        // The agent loop's last state: the request continues after a tool result.
        if (t === turns - 1 && step === steps - 1 && rng.chance(0.5)) break;
      }
      if (messages[messages.length - 1].role === "tool" && t === turns - 1 && rng.chance(0.6)) break;
      if (rng.chance(0.85)) {
        const m = { role: "assistant", content: content(assistantText(), false) };
        reasoning(m);
        messages.push(m);
      }
    }
    if (rng.chance(0.1)) messages.push({ role: "assistant", content: assistantText() });  // a trailing answer
    const object = { messages };
    const toolsForm = rng();
    if (tools.length > 0) object.tools = tools;
    else if (toolsForm < 0.3) object.tools = [];
    else if (toolsForm < 0.4) object.tools = null;
    // chat_template_kwargs: thinking off (absent, false, null) or on; preserve_thinking.
    const kw = {};
    const think = rng();
    if (think < 0.4) kw.enable_thinking = true;
    else if (think < 0.6) kw.enable_thinking = false;
    else if (think < 0.65) kw.enable_thinking = null;
    const preserve = rng();
    if (preserve < 0.3) kw.preserve_thinking = true;
    else if (preserve < 0.4) kw.preserve_thinking = false;
    if (Object.keys(kw).length > 0 || rng.chance(0.5)) object.chat_template_kwargs = kw;
    return { object, calls, undefinedThinking: rng.chance(0.5), pythonOnly };
  };
}

// ---- the expected input of the template ------------------------------------------------------

const textOf = (content) => (content == null ? "" : typeof content === "string" ? content : content.map((p) => p.text).join(""));

// The template's view of an OpenAI-shaped conversation, as lily reads it (text/chat_messages.h):
// developer -> system, reasoning -> reasoning_content, arguments -> objects; with thinking
// disabled, Lily's history rewrite; the kwargs the template sees.
function templateCase({ object, calls, undefinedThinking }) {
  const kw = object.chat_template_kwargs ?? {};
  const thinking = kw.enable_thinking === true;
  let lastUser = -1;
  object.messages.forEach((m, i) => { if (m.role === "user") lastUser = i; });
  const messages = object.messages.map((m, i) => {
    const out = { ...m };
    if (out.role === "developer") out.role = "system";
    if (out.role === "assistant") {
      if (typeof out.reasoning_content !== "string" && typeof out.reasoning === "string") out.reasoning_content = out.reasoning;
      delete out.reasoning;
      if (out.tool_calls) {
        out.tool_calls = out.tool_calls.map((call) => {
          const fn = { name: call.function.name };
          if (calls.get(call) !== undefined) fn.arguments = calls.get(call);
          return { ...call, function: fn };
        });
      }
      if (!thinking && i <= lastUser) {
        const c = textOf(out.content);
        out.content = c.startsWith(EMPTY_THINK) ? c : EMPTY_THINK + c;
        out.reasoning_content = "";
      }
    }
    return out;
  });
  const kwargs = {};
  if (!thinking) kwargs.enable_thinking = false;
  else if (!undefinedThinking) kwargs.enable_thinking = true;
  // Thinking off: lily does not pass preserve_thinking on (the rewrite emptied what it keeps).
  if (thinking && typeof kw.preserve_thinking === "boolean") kwargs.preserve_thinking = kw.preserve_thinking;
  return toText({ messages, tools: object.tools ?? [], kwargs });
}

// ---- fixed cases -----------------------------------------------------------------------------

const WEATHER = { type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] } } };
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
const FIXED = [
  { tools: [WEATHER], messages: [{ role: "user", content: "Weather in Paris?" }] },
  { tools: [WEATHER], messages: [{ role: "system", content: " Be brief. " }, { role: "user", content: "q" }] },
  { tools: [WEATHER], messages: [{ role: "developer", content: "\n" }, { role: "user", content: "q" }] },
  { tools: [WEATHER], messages: [{ role: "user", content: "q" },
    { role: "assistant", content: null, tool_calls: [call("c1", "get_weather", { city: "Paris", days: 3 })] },
    { role: "tool", tool_call_id: "c1", content: "18°C" }] },
  { tools: [WEATHER], messages: [{ role: "user", content: "q" },
    { role: "assistant", content: "Checking both.", tool_calls: [call("a", "get_weather", { city: "A" }), call("b", "get_weather", { city: "B" })] },
    { role: "tool", tool_call_id: "a", content: "1" }, { role: "tool", tool_call_id: "b", content: [{ type: "text", text: "2" }] },
    { role: "assistant", content: "Both mild." }, { role: "user", content: "thanks" }] },
  { chat_template_kwargs: { enable_thinking: true }, tools: [WEATHER], messages: [{ role: "user", content: "q" },
    { role: "assistant", content: "", reasoning_content: "I need the weather.", tool_calls: [call("c", "get_weather", { city: "P" })] },
    { role: "tool", content: "r" }] },
  { chat_template_kwargs: { enable_thinking: true, preserve_thinking: true }, messages: [{ role: "user", content: "q1" },
    { role: "assistant", content: "A1", reasoning: "r1" }, { role: "user", content: "q2" }] },
  { chat_template_kwargs: { preserve_thinking: true }, messages: [{ role: "user", content: "q1" },
    { role: "assistant", content: "A1", reasoning_content: "r1" }, { role: "user", content: "q2" }] },
  { messages: [{ role: "tool", content: "leading" }, { role: "user", content: "q" }] },
  { messages: [{ role: "system", content: "S" }, { role: "tool", content: null }, { role: "user", content: "q" }, { role: "tool", content: "" }] },
  { chat_template_kwargs: { enable_thinking: true }, messages: [{ role: "user", content: "q" },
    { role: "assistant", content: "<think>r</think>\n\nLet me call.", tool_calls: [call("c", "f", {})] },
    { role: "assistant", content: "<think>r</think>", tool_calls: [{ function: { name: "g" } }] }] },
  { messages: [{ role: "user", content: "q" }, { role: "assistant", content: "a" }, { role: "user", content: "<tool_response>r</tool_response>" },
    { role: "assistant", content: null, tool_calls: [call("c", "f", { s: "  raw \n text " })] }, { role: "tool", content: "r" }] },
];

// Template-raised errors.
const TEMPLATE_ERRORS = [
  { messages: [] },
  { tools: [WEATHER], messages: [{ role: "tool", content: "r" }] },
  { messages: [{ role: "user", content: "q" }, { role: "developer", content: "late" }] },
  { tools: [WEATHER], messages: [{ role: "user", content: "<tool_response>x</tool_response>" }, { role: "tool", content: "r" }] },
];

// Refused by Lily's reading of the OpenAI shapes: [object line, expected error text].
const LILY_ERRORS = [
  [{ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "https://x/y.png" } }] }] }, "messages[0].content[0]: image inputs are not supported"],
  [{ messages: [{ role: "user", content: [{ type: "input_audio", input_audio: {} }] }] }, "messages[0].content[0]: audio inputs are not supported"],
  [{ messages: [{ role: "function", content: "x" }] }, "messages[0].role must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\""],
  [{ messages: [{ role: "user", content: null }] }, "messages[0].content must be a string or an array of text parts, found null"],
  [{ messages: [{ role: "user", content: "q" }, { role: "assistant", tool_calls: [{ function: { name: "f", arguments: "{\"a\": " } }] }] }, "messages[1].tool_calls[0].function.arguments: not valid JSON"],
  [{ messages: [{ role: "user", content: "q" }, { role: "assistant", tool_calls: [{ function: { name: "f", arguments: "[1]" } }] }] }, "messages[1].tool_calls[0].function.arguments must encode a JSON object"],
  [{ messages: [{ role: "user", content: "q" }, { role: "assistant", tool_calls: [{ type: "custom", function: { name: "f" } }] }] }, "messages[1].tool_calls[0].type must be \"function\""],
  [{ messages: [{ role: "user", content: "q" }, { role: "assistant", tool_calls: [{ function: { name: "" } }] }] }, "messages[1].tool_calls[0].function.name must be a non-empty string"],
  [{ messages: [{ role: "user", content: "q" }], tools: { type: "function" } }, "tools must be an array"],
  [{ messages: [{ role: "user", content: "q" }], tools: [{ type: "function" }] }, "tools[0]: missing field \"function\""],
  [{ messages: [{ role: "user", content: "q" }], chat_template_kwargs: { enable_thinking: "yes" } }, "chat_template_kwargs.enable_thinking must be true, false or null"],
  [{ tools: [] }, "missing field \"messages\""],
];

// Where @huggingface/jinja and Python Jinja2 render differently. `hf` is a substring of the
// library's rendering; Jinja2's rendering (lily's answer) is the same text with it replaced by
// `jinja2`. In hf mode the harness checks that the library still renders `hf`; in jinja2 mode
// that Jinja2 renders `jinja2`.
const p = (name, text) => `<parameter=${name}>\n${text}\n</parameter>\n`;
const DIVERGENCES = [
  { why: "a float with an integral value: Python 1.0, JavaScript 1", args: "{\"x\": 1.0}", hf: p("x", "1"), jinja2: p("x", "1.0") },
  { why: "-0.0: Python -0.0, JavaScript 0", args: "{\"x\": -0.0}", hf: p("x", "0"), jinja2: p("x", "-0.0") },
  { why: "small floats: Python 1e-05, JavaScript 0.00001", args: "{\"x\": 1e-5}", hf: p("x", "0.00001"), jinja2: p("x", "1e-05") },
  { why: "large floats: Python 1e+16, JavaScript 10000000000000000", args: "{\"x\": 1e16}", hf: p("x", "10000000000000000"), jinja2: p("x", "1e+16") },
  { why: "integers past 2^53 lose precision in JavaScript", args: "{\"x\": 9007199254740993}", hf: p("x", "9007199254740992"), jinja2: p("x", "9007199254740993") },
  { why: "floats inside tojson values", args: "{\"x\": [2.0, {\"y\": 3.0}]}", hf: p("x", "[2, {\"y\": 3}]"), jinja2: p("x", "[2.0, {\"y\": 3.0}]") },
  { why: "integer-like keys come first in JavaScript objects", args: "{\"b\": 1, \"10\": 2}", hf: p("10", "2") + p("b", "1"), jinja2: p("b", "1") + p("10", "2") },
  { why: "a float in a tool schema", tools: "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"minimum\": 0.0}}}]",
    hf: "{\"minimum\": 0}", jinja2: "{\"minimum\": 0.0}" },
];

function divergenceLine(d) {
  const args = d.args ?? "{}";
  return `{"tools": ${d.tools ?? "[]"}, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null, ` +
    `"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ${JSON.stringify(args)}}}]}]}`;
}
function divergenceTemplateText(d) {
  const args = d.args ?? "{}";
  return `{"tools": ${d.tools ?? "[]"}, "kwargs": {"enable_thinking": false}, "messages": [{"role": "user", "content": "q"}, ` +
    `{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ${args}}}]}]}`;
}

// ---- coverage ------------------------------------------------------------------------------

function coverage(cases) {
  const n = { tools: 0, system: 0, developer: 0, calls: 0, parallelCalls: 0, argsString: 0, argsObject: 0,
    toolResults: 0, groupedResults: 0, lastIsTool: 0, nullContent: 0, contentParts: 0, reasoningContent: 0,
    reasoning: 0, thinkInContent: 0, thinkingOn: 0, preserveThinking: 0, multiStep: 0, pythonOnlyValues: 0 };
  for (const { object, pythonOnly } of cases) {
    const m = object.messages;
    const kw = object.chat_template_kwargs ?? {};
    if (object.tools?.length) n.tools++;
    if (m[0]?.role === "system") n.system++;
    if (m[0]?.role === "developer") n.developer++;
    const asst = m.filter((x) => x.role === "assistant");
    const callList = asst.flatMap((x) => x.tool_calls ?? []);
    if (callList.length) n.calls++;
    if (asst.some((x) => (x.tool_calls ?? []).length > 1)) n.parallelCalls++;
    if (callList.some((c) => typeof c.function.arguments === "string")) n.argsString++;
    if (callList.some((c) => c.function.arguments instanceof Obj)) n.argsObject++;
    if (m.some((x) => x.role === "tool")) n.toolResults++;
    if (m.some((x, i) => x.role === "tool" && m[i + 1]?.role === "tool")) n.groupedResults++;
    if (m[m.length - 1]?.role === "tool") n.lastIsTool++;
    if (m.some((x) => x.content === null || !("content" in x))) n.nullContent++;
    if (m.some((x) => Array.isArray(x.content))) n.contentParts++;
    if (asst.some((x) => typeof x.reasoning_content === "string")) n.reasoningContent++;
    if (asst.some((x) => typeof x.reasoning === "string" && typeof x.reasoning_content !== "string")) n.reasoning++;
    if (asst.some((x) => textOf(x.content).includes("</think>"))) n.thinkInContent++;
    if (kw.enable_thinking === true) n.thinkingOn++;
    if (kw.preserve_thinking === true) n.preserveThinking++;
    if (asst.filter((x) => x.tool_calls).length > 1) n.multiStep++;
    if (pythonOnly) n.pythonOnlyValues++;
  }
  return Object.entries(n).map(([k, v]) => `${k} ${v}`).join(", ");
}
// ---- main ----------------------------------------------------------------------------------

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (!fs.existsSync(opts.template)) fail(`template not found: ${opts.template} (tests/fixtures/ holds the copy)`);
  if (!fs.existsSync(opts.lily)) fail(`lily binary not found: ${opts.lily}`);
  const templateText = fs.readFileSync(opts.template, "utf8");
  const engine = opts.engine === "hf" ? await hfEngine(templateText) : jinja2Engine(opts.template, opts.python);
  const python = opts.engine === "jinja2";

  // {kind, name, line: Buffer, text?: template-shape JSON, want?}
  const cases = [];
  const next = generator(opts.seed, python);
  const seeded = [];
  for (let i = 0; i < opts.count; i++) {
    const c = next();
    seeded.push(c);
    cases.push({ kind: "random", name: `random #${i}`, line: Buffer.from(toText(c.object), "utf8"), text: templateCase(c) });
  }
  const plain = (object) => ({ object, calls: collectCalls(object), undefinedThinking: false });
  FIXED.forEach((o, i) => cases.push({ kind: "fixed", name: `fixed #${i}`, line: Buffer.from(JSON.stringify(o)), text: templateCase(plain(o)) }));
  TEMPLATE_ERRORS.forEach((o, i) => cases.push({ kind: "template-error", name: `template error #${i}`, line: Buffer.from(JSON.stringify(o)), text: templateCase(plain(o)) }));
  // Seeded template errors: a system/developer message out of first place, no user message
  // (tool results only count as no query), or every user message a <tool_response> wrapper.
  const errRng = makeRng(opts.seed ^ 0x5eed);
  for (let i = 0; i < 60; i++) {
    const c = next();
    const m = c.object.messages;
    const way = i % 3;
    if (way === 0) m.splice(1 + errRng.int(m.length), 0, { role: errRng.chance(0.5) ? "developer" : "system", content: `late ${i}` });
    else if (way === 1) c.object.messages = m.filter((x) => x.role !== "user");
    else m.forEach((x) => { if (x.role === "user") x.content = `<tool_response>${textOf(x.content)}</tool_response>`; });
    if (c.object.messages.length === 0) c.object.messages.push({ role: "tool", content: "r" });
    cases.push({ kind: "template-error", name: `seeded error #${i}`, line: Buffer.from(toText(c.object), "utf8"), text: templateCase(c) });
  }
  LILY_ERRORS.forEach(([o, rule], i) => cases.push({ kind: "lily-rule", name: `lily rule #${i}`, line: Buffer.from(JSON.stringify(o)), want: { rule } }));
  DIVERGENCES.forEach((d, i) => cases.push({ kind: "divergence", name: `engine divergence #${i}`, line: Buffer.from(divergenceLine(d)), text: divergenceTemplateText(d), divergence: d }));

  const toRender = cases.filter((c) => c.text !== undefined);
  const rendered = engine.renderAll(toRender.map((c) => ({ text: c.text })));
  if (rendered.length !== toRender.length) fail(`engine answered ${rendered.length} of ${toRender.length} cases`);
  toRender.forEach((c, i) => { c.engine = rendered[i]; });

  const out = runLily(opts.lily, cases.map((c) => c.line));
  const counts = {};
  const bump = (key) => { counts[key] = (counts[key] ?? 0) + 1; };
  const mismatches = [];
  cases.forEach((c, i) => {
    let want = c.want ?? c.engine;
    if (c.kind === "divergence") {
      const d = c.divergence;
      const prompt = c.engine.prompt;
      if (prompt === undefined) { mismatches.push({ c, why: `${engine.name} raised ${esc(c.engine.raised)}` }); return; }
      if (opts.engine === "hf") {
        if (!prompt.includes(d.hf) || prompt.includes(d.jinja2)) {
          mismatches.push({ c, why: `${engine.name} no longer renders ${esc(d.hf)} here (${d.why}); update docs/chat-format.md and this list` });
          return;
        }
        want = { prompt: prompt.replace(d.hf, d.jinja2) };
        bump("divergences confirmed");
      } else if (!prompt.includes(d.jinja2)) {
        mismatches.push({ c, why: `Jinja2 no longer renders ${esc(d.jinja2)} (${d.why})` });
        return;
      }
    }
    const [key, why] = judge(out[i], want);
    if (key === null) mismatches.push({ c, why });
    else bump(key === "lily-rule errors agree" ? key : `${key} (${c.kind})`);
  });

  const randomRendered = cases.filter((c) => c.kind === "random" && c.engine?.prompt !== undefined).length;
  console.log(`chat tools oracle: lily render-chat vs ${engine.name}, template ${opts.template}, seed ${opts.seed}`);
  console.log(`  ${cases.length} cases: ${opts.count} seeded conversations (${randomRendered} render, ${opts.count - randomRendered} raise), ` +
    `${FIXED.length} fixed, ${TEMPLATE_ERRORS.length + 60} template-error, ${LILY_ERRORS.length} lily-rule, ${DIVERGENCES.length} engine-divergence`);
  console.log(`  seeded conversations exercise: ${coverage(seeded)}`);
  for (const key of Object.keys(counts).sort()) console.log(`  ${counts[key]} ${key}`);
  console.log(`  ${mismatches.length} mismatches`);
  for (const { c, why } of mismatches.slice(0, opts.show)) {
    console.log(`  MISMATCH ${c.name}: ${why}`);
    console.log(`      input ${c.line.toString("utf8").slice(0, 600)}`);
  }
  if (mismatches.length) fail(`${mismatches.length} of ${cases.length} cases differ`);
  console.log("chat tools oracle: PASS");
}

// The parsed arguments of each call of a plain (JSON.stringify-able) conversation.
function collectCalls(object) {
  const calls = new Map();
  for (const m of object.messages ?? []) {
    for (const c of m.tool_calls ?? []) {
      const a = c.function?.arguments;
      calls.set(c, a === undefined ? undefined : typeof a === "string" ? JSON.parse(a) : a);
    }
  }
  return calls;
}

main();
