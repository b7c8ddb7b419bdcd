// Chat-format oracle: `lily render-chat` must match a real Jinja rendering of the checkpoint template byte for byte.
//
//   node oracle.mjs --lily BUILD/lily --template tests/fixtures/qwen3.6-chat_template.jinja
//                   [--engine hf|jinja2] [--count 600] [--seed 20260503] [--show 5]
//
// --engine hf (default, the CI oracle): @huggingface/jinja, pinned in package.json; install it
//   with `bash tests/oracle/chat/install.sh`. Seeded conversations avoid the two places where
//   that library disagrees with Python Jinja2 (docs/chat-format.md, "Engine differences");
//   those are checked by hand-written cases whose expected text is Jinja2's, and the harness
//   confirms the library still renders them differently.
// --engine jinja2: Python Jinja2 through render_jinja2.py (exit 77 = SKIPPED when jinja2 is
//   not importable); the seeded conversations then also use the divergence-prone characters.
//
// Every case is one input line for lily. The expected answer is: an error when Lily's own
// message rules (role, content type, exact fields) or the JSON reading reject the line,
// else the engine's rendering of the template after Lily's nothink history rewrite, or an
// error carrying the template's raise_exception() text when the template raises.
import fs from "node:fs";

import { EMPTY_THINK, esc, fail, hfEngine, jinja2Engine, judge, makeRng, runLily } from "./common.mjs";

// ---- arguments ---------------------------------------------------------------------------

function parseArgs(argv) {
  const opts = { engine: "hf", count: 600, seed: 20260503, show: 5, python: "python3" };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, "");
    const value = argv[++i];
    if (value === undefined) fail(`option --${key} needs a value`);
    if (["count", "seed", "show"].includes(key)) opts[key] = Number(value);
    else if (["lily", "template", "engine", "python"].includes(key)) opts[key] = value;
    else fail(`unknown option --${key}`);
  }
  if (!opts.lily || !opts.template) fail("usage: node oracle.mjs --lily PATH --template PATH [--engine hf|jinja2]");
  if (!["hf", "jinja2"].includes(opts.engine)) fail(`--engine must be hf or jinja2, not ${opts.engine}`);
  return opts;
}

// ---- seeded generator --------------------------------------------------------------------

// Whitespace every engine trims the same way (Python str.strip, JS String.trim, Rust trim).
const WS_COMMON = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\v", "\f", "\u00a0", "\u2003", "\u3000", "\u2028", "\u202f"];
// Whitespace the engines disagree on: Python strips U+001C..U+001F and U+0085, JS strips U+FEFF.
const WS_DIVERGENT = ["\u0085", "\u001c", "\u001f", "\ufeff"];
const WORDS = ["hello", "world", "Qwen", "lily", "answer", "42", "x", "the quick brown fox",
  "What is 2+2?", "Name the two colors of a chessboard.", "ok", "a-b_c", "tabs\tinside", "line\nbreak"];
const UNICODE = ["é", "ß", "日本語", "中文字符", "😀", "👩‍💻", "עברית", "مرحبا", "e\u0301", "\u200b",
  "Ω≈ç√", "🇩🇪", "\u0000", "\u0001", "\u007f", "\u00ad", "𝔘𝔫𝔦", "ǅ", "\u2029"];
const MARKUP = ["<think>", "</think>", "<|im_start|>", "<|im_end|>", "<tool_response>", "</tool_response>",
  "{{ x }}", "{% if x %}", "{#", "\\n", "'", "\"", "\\", "<|endoftext|>", "user\n", "assistant"];

function generator(seed, divergent) {
  const rng = makeRng(seed);
  const ws = divergent ? WS_COMMON.concat(WS_DIVERGENT, WS_DIVERGENT) : WS_COMMON;

  const edge = (p) => (rng.chance(p) ? Array.from({ length: 1 + rng.int(3) }, () => rng.pick(ws)).join("") : "");
  function body() {
    const n = 1 + rng.int(8);
    let out = "";
    for (let i = 0; i < n; i++) {
      const r = rng();
      if (r < 0.5) out += rng.pick(WORDS);
      else if (r < 0.7) out += rng.pick(UNICODE);
      else if (r < 0.8) out += rng.pick(MARKUP);
      else out += rng.pick(ws);
      if (rng.chance(0.5)) out += " ";
    }
    return out;
  }
  function text() {
    const r = rng();
    if (r < 0.1) return "";
    if (r < 0.15) return edge(1);
    return edge(0.35) + body() + edge(0.35);
  }
  const seps = divergent ? ["", "\n", "\n\n", " ", "\n \n", "\t", "\n\u0085", "\ufeff"] : ["", "\n", "\n\n", "\n\n\n"];
  function assistantText() {
    const r = rng();
    if (r < 0.35) return text();
    if (r < 0.55) return `${edge(0.2)}<think>${rng.pick(seps)}${text()}${rng.pick(seps)}</think>${rng.pick(seps)}${text()}`;
    if (r < 0.65) return EMPTY_THINK + text();
    if (r < 0.75) {
      const miss = rng.pick(["<think>\n</think>\n\n", "<think>\n\n</think>\n", " " + EMPTY_THINK, "<think></think>",
        "\n" + EMPTY_THINK, EMPTY_THINK.trimEnd()]);
      return miss + text();
    }
    // Stray and repeated tags.
    const parts = [text(), rng.pick(["<think>", "</think>", "</think>", "<think>"]), text()];
    for (let k = rng.int(3); k > 0; k--) parts.push(rng.pick(["<think>", "</think>"]) + rng.pick(seps), text());
    return parts.join("");
  }
  function userText() {
    if (rng.chance(0.08)) return `${edge(0.5)}<tool_response>${text()}</tool_response>${edge(0.5)}`;
    return text();
  }
  // One conversation: optional system, then 1..12 messages.
  return function conversation() {
    const messages = [];
    if (rng.chance(0.5)) messages.push({ role: "system", content: text() });
    const n = 1 + rng.int(12);
    const style = rng();
    const roles = [];
    if (style < 0.6) {
      // API shape: alternating, ending with a user turn.
      for (let i = 0; i < n; i++) roles.push((n - 1 - i) % 2 === 0 ? "user" : "assistant");
    } else if (style < 0.8) {
      // Alternating from a user turn, then up to two trailing assistant turns.
      for (let i = 0; i < n; i++) roles.push(i % 2 === 0 ? "user" : "assistant");
      for (let k = rng.int(3); k > 0; k--) roles.push("assistant");
    } else {
      for (let i = 0; i < n; i++) roles.push(rng.chance(0.5) ? "user" : "assistant");
    }
    for (const role of roles) messages.push({ role, content: role === "user" ? userText() : assistantText() });
    if (!divergent) for (const m of messages) m.content = portable(m.content);
    return messages;
  };
}

// @huggingface/jinja's lstrip('\n') strips all whitespace; keep "</think>" + '\n'* followed by
// other whitespace out of the portable conversations (one character at a time until none).
function portable(content) {
  const re = /(<\/think>\n*)[^\S\n]/u;
  while (re.test(content)) content = content.replace(re, "$1");
  return content;
}

// ---- the reference: Lily's message rules and history rewrite ------------------------------

// Lily's own rules (docs/chat-format.md §1): an array of objects with exactly role and content,
// role system/user/assistant, content a string. null when accepted, else what to look for in
// lily's error text.
function lilyRule(messages) {
  if (!Array.isArray(messages)) return "must be a JSON array";
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    if (m === null || typeof m !== "object" || Array.isArray(m)) return `messages[${i}] must be an object`;
    for (const key of Object.keys(m)) if (key !== "role" && key !== "content") return `messages[${i}]: unknown field "${key}"`;
    if (!("role" in m)) return `messages[${i}]: missing field "role"`;
    if (!["system", "user", "assistant"].includes(m.role)) return `messages[${i}].role must be`;
    if (!("content" in m)) return `messages[${i}]: missing field "content"`;
    if (typeof m.content !== "string") return `messages[${i}].content must be a string`;
  }
  return null;
}

// Lily's nothink history rewrite (docs/chat-format.md §3): assistant turns at or before the
// last user turn get the empty think block in front (unless already there) and
// reasoning_content = "".
function historyRewrite(messages) {
  let lastUser = -1;
  messages.forEach((m, i) => { if (m.role === "user") lastUser = i; });
  return messages.map((m, i) => {
    if (m.role !== "assistant" || i > lastUser) return { ...m };
    const content = m.content.startsWith(EMPTY_THINK) ? m.content : EMPTY_THINK + m.content;
    return { role: m.role, content, reasoning_content: "" };
  });
}

// ---- fixed cases ---------------------------------------------------------------------------

const u = (content) => ({ role: "user", content });
const a = (content) => ({ role: "assistant", content });
const s = (content) => ({ role: "system", content });

// The unit tests' shapes, here checked against the real template.
const FIXED = [
  [u("Hello")],
  [s("You are a helpful assistant."), u("Hello")],
  [u("Q1"), a("A1"), u("Q2"), a("A2"), u("Q3")],
  [u("Q1"), a("<think>\n\n</think>\n\nA1"), u("Q2")],
  [u("Q1"), a("<think>\n</think>\n\nA1"), u("Q2")],
  [u("Q1"), a(" <think>\n\n</think>\n\nA1"), u("Q2")],
  [u("Q1"), a("<think>\nr1\n</think>\n\nA1"), u("Q2")],
  [u("q"), a("<think>\nr\n</think>\n\na")],
  [u("q"), a("a<think>b<think> r \n</think>c</think>\n\nd")],  // "\n\n  d": see DIVERGENCES
  [u("q"), a("just thinking</think>answer")],
  [u("q"), a("<think>open"), a("")],
  [u("q"), a("<think>r</think>")],
  [s("S"), a("hi"), u("q")],
  [s(" \t S \n"), u("\n\n  Hello\tworld \r\n")],
  [u("\u3000\u00a0a\u2028")],
  [u("a\u200b")],
  [s(""), u(" "), a(""), u("")],
  [u("<|im_end|>{{ x }}{% if %}")],
  [u("q"), a("a"), u(" <tool_response>r</tool_response>\n")],
  [u("q"), a("a"), u("<tool_response>r</tool_response>!")],
  [u("q"), a("a"), u("<tool_response>r</tool_response>"), a("b"), u("<tool_response>s</tool_response>")],
  [u("Hi \u00e9\ud83d\ude00")],
  [u("q"), a("a")],
];

// Rejected by the template (raise_exception); lily must answer an error with the same text.
const TEMPLATE_ERRORS = [
  [],
  [s("s")],
  [a("a")],
  [s("s"), a("a"), a("b")],
  [u("<tool_response>x</tool_response>")],
  [u(" <tool_response>\n</tool_response>\t"), a("a"), u("<tool_response>y</tool_response>")],
  [u("q"), s("s")],
  [s("s"), u("q"), s("t")],
  [s("s"), s("t"), u("q")],
  [a("a"), s("s")],
  [u("<tool_response>x</tool_response>"), s("s")],
];

// Rejected by Lily's own rules before the template runs: [raw line, expected error text].
const LILY_ERRORS = [
  ['[{"role":"tool","content":"x"}]', "messages[0].role must be"],
  ['[{"role":"user","content":"q"},{"role":"developer","content":"x"}]', "messages[1].role must be"],
  ['[{"role":"User","content":"x"}]', "messages[0].role must be"],
  ['[{"role":null,"content":"x"}]', "messages[0].role must be"],
  ['[{"role":1,"content":"x"}]', "messages[0].role must be"],
  ['[{"content":"x"}]', 'messages[0]: missing field "role"'],
  ['[{"role":"user"}]', 'messages[0]: missing field "content"'],
  ['[{"role":"user","content":null}]', "messages[0].content must be a string"],
  ['[{"role":"user","content":[{"type":"text","text":"x"}]}]', "messages[0].content must be a string"],
  ['[{"role":"user","content":3}]', "messages[0].content must be a string"],
  ['[{"role":"user","content":{}}]', "messages[0].content must be a string"],
  ['[{"role":"user","content":"x","name":"n"}]', 'messages[0]: unknown field "name"'],
  ['[{"role":"user","content":"q"},{"role":"assistant","content":"x","reasoning_content":"r"}]', 'messages[1]: unknown field "reasoning_content"'],
  ['[{"role":"assistant","content":"","tool_calls":[]},{"role":"user","content":"q"}]', 'messages[0]: unknown field "tool_calls"'],
  ['["user"]', "messages[0] must be an object"],
  ['{"role":"user","content":"x"}', 'missing field "messages"'],  // an object line is a conversation
  ['"hello"', "must be a JSON array"],
  ["null", "must be a JSON array"],
  ["", "not valid JSON"],
  ["not json", "not valid JSON"],
  ['[{"role":"user","content":"x"}', "not valid JSON"],
  ['[{"role":"user","content":"x"}] []', "not valid JSON"],
  ['[{"role":"user","content":"a","content":"b"}]', 'duplicate key "content"'],
  ["[".repeat(70) + "]".repeat(70), "JSON nesting deeper than"],
  [Buffer.from('[{"role":"user","content":"\xff\xfe"}]', "latin1"), "not valid JSON"],
  [Buffer.from('[{"role":"user","content":"\xed\xa0\x80"}]', "latin1"), "not valid JSON"],
  ['[{"role":"user","content":"\\ud800"}]', "not valid JSON"],
];

// Where @huggingface/jinja 0.5.11 and Python Jinja2 disagree. `jinja2` is Jinja2's answer
// (lily follows it); the hf engine must still answer differently, or this list is stale.
const DIVERGENCES = [
  { why: "lstrip('\\n') after </think>: Jinja2 keeps other leading whitespace, hf strips it",
    messages: [u("q"), a("<think>r</think>\n  a")],
    jinja2: { prompt: "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n  a<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "trim: U+0085 and U+001C are whitespace in Python, not in JS",
    messages: [u("\u0085hi\u001c")],
    jinja2: { prompt: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "trim: U+FEFF is whitespace in JS, not in Python",
    messages: [u("\ufeffhi\ufeff")],
    jinja2: { prompt: "<|im_start|>user\n\ufeffhi\ufeff<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "trim of the system message: U+001F and U+0085",
    messages: [s("\u001fS\u0085"), u("q")],
    jinja2: { prompt: "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "trim of split-out reasoning, and lstrip('\\n') of the content after </think>",
    messages: [u("q"), a("<think>\ufeffr\u001e</think>\ta")],
    jinja2: { prompt: "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\ufeffr\n</think>\n\n\ta<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "tool_response test after trim (U+FEFF): a query for Jinja2, not for hf (which raises)",
    messages: [u("\ufeff<tool_response>x</tool_response>")],
    jinja2: { prompt: "<|im_start|>user\n\ufeff<tool_response>x</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" } },
  { why: "tool_response test after trim (U+001D): Jinja2 raises, hf renders",
    messages: [u("\u001d<tool_response>x</tool_response>")],
    jinja2: { raised: "No user query found in messages." } },
];

// How many seeded conversations reach each template branch (shows the generator is not idle).
function coverage(conversations) {
  const n = { system: 0, rewritten: 0, alreadyBlock: 0, afterLastUser: 0, thinkSplit: 0, toolResponseUser: 0,
    queryBeforeLastUser: 0, emptyContent: 0, edgeWhitespace: 0 };
  for (const m of conversations) {
    let lastUser = -1;
    m.forEach((x, i) => { if (x.role === "user") lastUser = i; });
    const wrapped = (x) => /^\s*<tool_response>[^]*<\/tool_response>\s*$/u.test(x.content);
    let lastQuery = -1;
    m.forEach((x, i) => { if (x.role === "user" && !wrapped(x)) lastQuery = i; });
    const has = (f) => m.some(f);
    if (m[0]?.role === "system") n.system++;
    if (has((x, i) => x.role === "assistant" && i < lastUser)) n.rewritten++;
    if (has((x, i) => x.role === "assistant" && i < lastUser && x.content.startsWith(EMPTY_THINK))) n.alreadyBlock++;
    if (has((x, i) => x.role === "assistant" && i > lastUser)) n.afterLastUser++;
    if (has((x, i) => x.role === "assistant" && i > lastUser && x.content.includes("</think>"))) n.thinkSplit++;
    if (has((x) => x.role === "user" && wrapped(x))) n.toolResponseUser++;
    if (lastQuery >= 0 && lastQuery < lastUser) n.queryBeforeLastUser++;
    if (has((x) => x.content === "")) n.emptyContent++;
    if (has((x) => /^\s|\s$/u.test(x.content))) n.edgeWhitespace++;
  }
  return Object.entries(n).map(([k, v]) => `${k} ${v}`).join(", ");
}

function main() {
  return (async () => {
    const opts = parseArgs(process.argv.slice(2));
    if (!fs.existsSync(opts.template)) fail(`template not found: ${opts.template} (tests/fixtures/ holds the copy)`);
    if (!fs.existsSync(opts.lily)) fail(`lily binary not found: ${opts.lily}`);
    const templateText = fs.readFileSync(opts.template, "utf8");
    const engine = opts.engine === "hf" ? await hfEngine(templateText) : jinja2Engine(opts.template, opts.python);
    const divergent = opts.engine === "jinja2";

    // Build the cases: {kind, line (Buffer), messages?, expectRule?, jinja2?}.
    const cases = [];
    const next = generator(opts.seed, divergent);
    for (let i = 0; i < opts.count; i++) cases.push({ kind: "random", name: `random #${i}`, messages: next() });
    FIXED.forEach((m, i) => cases.push({ kind: "fixed", name: `fixed #${i}`, messages: m }));
    TEMPLATE_ERRORS.forEach((m, i) => cases.push({ kind: "template-error", name: `template error #${i}`, messages: m }));
    // Seeded error conversations: a system message moved out of first place, no user turn,
    // or every user turn wrapped in <tool_response>.
    const errRng = makeRng(opts.seed ^ 0x5eed);
    for (let i = 0; i < 100; i++) {
      const m = next();
      const way = i % 3;
      if (way === 0) m.splice(1 + errRng.int(m.length), 0, s(`late system ${i}`));
      else if (way === 1) m.forEach((x) => { if (x.role === "user") x.role = "assistant"; });
      else m.forEach((x) => { if (x.role === "user") x.content = `<tool_response>${x.content}</tool_response>`; });
      cases.push({ kind: "template-error", name: `seeded error #${i}`, messages: m });
    }
    LILY_ERRORS.forEach(([line, expect], i) =>
      cases.push({ kind: "lily-rule", name: `lily rule #${i}`, line: Buffer.isBuffer(line) ? line : Buffer.from(line, "utf8"), expectRule: expect }));
    DIVERGENCES.forEach((d, i) => cases.push({ kind: "divergence", name: `engine divergence #${i}`, messages: d.messages, divergence: d }));

    // Expected answers.
    const toRender = [];
    for (const c of cases) {
      if (c.messages) {
        c.line = Buffer.from(JSON.stringify(c.messages), "utf8");
        const rule = lilyRule(c.messages);
        if (rule) { c.expectRule = rule; continue; }
        c.renderIndex = toRender.length;
        toRender.push({ messages: historyRewrite(c.messages) });
      }
    }
    const rendered = engine.renderAll(toRender);
    if (rendered.length !== toRender.length) fail(`engine answered ${rendered.length} of ${toRender.length} cases`);
    for (const c of cases) if (c.renderIndex !== undefined) c.engine = rendered[c.renderIndex];

    // Run lily once over all lines.
    const out = runLily(opts.lily, cases.map((c) => c.line));

    const counts = {};
    const bump = (key) => { counts[key] = (counts[key] ?? 0) + 1; };
    const mismatches = [];
    cases.forEach((c, i) => {
      // What lily must answer: the engine's answer, except for divergences (Jinja2's answer).
      let want = c.expectRule !== undefined ? { rule: c.expectRule } : c.engine;
      if (c.kind === "divergence") {
        if (opts.engine === "hf") {
          const same = JSON.stringify(c.engine) === JSON.stringify(c.divergence.jinja2);
          if (same) { mismatches.push({ c, why: `${engine.name} now agrees with Jinja2 here (${c.divergence.why}); update docs/chat-format.md and this list` }); return; }
          bump("divergences confirmed");
        } else if (JSON.stringify(c.engine) !== JSON.stringify(c.divergence.jinja2)) {
          mismatches.push({ c, why: `Jinja2 no longer gives the recorded answer:\n      recorded ${esc(JSON.stringify(c.divergence.jinja2))}\n      jinja2   ${esc(JSON.stringify(c.engine))}` });
          return;
        }
        want = c.divergence.jinja2;
      }
      const [key, why] = judge(out[i], want);
      if (key === null) mismatches.push({ c, why });
      else bump(key === "lily-rule errors agree" ? key : `${key} (${c.kind})`);
    });

    const randomRendered = cases.filter((c) => c.kind === "random" && c.engine && c.engine.prompt !== undefined).length;
    console.log(`chat oracle: lily render-chat vs ${engine.name}, template ${opts.template}, seed ${opts.seed}`);
    console.log(`  ${cases.length} cases: ${opts.count} seeded conversations (${randomRendered} render, ${opts.count - randomRendered} raise), ` +
      `${FIXED.length} fixed, ${TEMPLATE_ERRORS.length + 100} template-error, ${LILY_ERRORS.length} lily-rule, ${DIVERGENCES.length} engine-divergence`);
    console.log(`  seeded conversations exercise: ${coverage(cases.filter((c) => c.kind === "random").map((c) => c.messages))}`);
    for (const key of Object.keys(counts).sort()) console.log(`  ${counts[key]} ${key}`);
    console.log(`  ${mismatches.length} mismatches`);
    for (const { c, why } of mismatches.slice(0, opts.show)) {
      console.log(`  MISMATCH ${c.name}: ${why}`);
      console.log(`      input ${c.line.toString("utf8").slice(0, 400)}`);
    }
    if (mismatches.length) fail(`${mismatches.length} of ${cases.length} cases differ`);
    console.log("chat oracle: PASS");
  })();
}

main();
