// Shared parts of the chat oracles: the seeded RNG, the two Jinja engines, and mismatch reports.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const HF_VERSION = "0.5.11";
export const EMPTY_THINK = "<think>\n\n</think>\n\n";

export function fail(message, code = 1) {
  console.error(`chat oracle: FAIL: ${message}`);
  process.exit(code);
}

// mulberry32: small, deterministic on every Node version.
export function makeRng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  next.int = (n) => Math.floor(next() * n);
  next.pick = (list) => list[next.int(list.length)];
  next.chance = (p) => next() < p;
  return next;
}

// ---- engines -------------------------------------------------------------------------------
//
// Both render a list of cases. A case is {messages, tools?, kwargs?} (tools default [], kwargs
// default {enable_thinking: false}, Lily's context) or {text}: the same object as JSON text,
// for numbers JavaScript cannot hold (1.0, -0.0, integers past 2^53) and object keys in an
// order JavaScript objects do not keep (integer-like keys). Python reads the text itself; the
// hf engine gets JSON.parse(text), i.e. what a JavaScript caller of the library would pass.
// The render context is transformers' apply_chat_template: add_generation_prompt = true,
// then tools and the kwargs.

const caseObject = (c) => (c.text !== undefined ? JSON.parse(c.text) : c);

export async function hfEngine(templateText) {
  let jinja;
  try {
    jinja = await import("@huggingface/jinja");
  } catch (error) {
    fail(`@huggingface/jinja is not installed (${error.code ?? error.message}).\n` +
      `  Run: bash tests/oracle/chat/install.sh   (npm ci into tests/oracle/chat/node_modules)`);
  }
  const pkg = JSON.parse(fs.readFileSync(path.join(here, "node_modules/@huggingface/jinja/package.json"), "utf8"));
  if (pkg.version !== HF_VERSION) fail(`@huggingface/jinja is ${pkg.version}, expected ${HF_VERSION}; run tests/oracle/chat/install.sh`);
  const template = new jinja.Template(templateText);
  return {
    name: `@huggingface/jinja ${pkg.version} (Node.js ${process.version})`,
    renderAll(list) {
      return list.map((c) => {
        const { messages, tools = [], kwargs = { enable_thinking: false } } = caseObject(c);
        try {
          return { prompt: template.render({ messages, tools, add_generation_prompt: true, ...kwargs }) };
        } catch (error) {
          return { raised: error.message };
        }
      });
    },
  };
}

export function jinja2Engine(templatePath, python) {
  const script = path.join(here, "render_jinja2.py");
  return {
    name: "Python jinja2",
    renderAll(list) {
      const input = list.map((c) => (c.text !== undefined ? c.text : JSON.stringify(c)) + "\n").join("");
      const run = spawnSync(python, [script, "--template", templatePath], { input, maxBuffer: 1 << 30 });
      if (run.error) fail(`cannot run ${python}: ${run.error.message}`);
      if (run.status === 77) {
        console.log(`chat oracle: SKIPPED: ${run.stderr.toString().trim()}`);
        process.exit(77);
      }
      if (run.status !== 0) fail(`render_jinja2.py exited ${run.status}: ${run.stderr}`);
      const lines = run.stdout.toString("utf8").split("\n").filter((l) => l !== "");
      this.name = JSON.parse(lines[0]).engine;
      return lines.slice(1).map((l) => JSON.parse(l));
    },
  };
}

// ---- lily and reports ----------------------------------------------------------------------

// Runs `lily render-chat` once over all lines (Buffers); returns one string per line.
export function runLily(lily, lines) {
  const input = Buffer.concat(lines.flatMap((line) => [line, Buffer.from("\n")]));
  const run = spawnSync(lily, ["render-chat"], { input, maxBuffer: 1 << 30 });
  if (run.error) fail(`cannot run ${lily}: ${run.error.message}`);
  if (run.status !== 0) fail(`lily render-chat exited ${run.status}; stderr: ${run.stderr}`);
  if (run.stderr.length !== 0) fail(`lily render-chat wrote to stderr: ${run.stderr}`);
  const out = run.stdout.toString("utf8").split("\n");
  if (out.pop() !== "") fail("lily's output does not end with a newline");
  if (out.length !== lines.length) fail(`lily answered ${out.length} lines for ${lines.length} input lines`);
  return out;
}

export const esc = (text) => JSON.stringify(text);

export function describeDiff(expected, actual) {
  let i = 0;
  while (i < expected.length && i < actual.length && expected[i] === actual[i]) i++;
  const from = Math.max(0, i - 40);
  return [
    `      first difference at UTF-16 offset ${i} (expected length ${expected.length}, got ${actual.length})`,
    `      expected …${esc(expected.slice(from, i + 40))}…`,
    `      lily     …${esc(actual.slice(from, i + 40))}…`,
  ].join("\n");
}

// Compares lily's answer line `out` with what it must be: {rule: substring of Lily's own
// error}, {raised: template text} or {prompt}. Returns [countKey] or [null, why].
export function judge(out, want) {
  let got;
  try { got = JSON.parse(out); } catch { return [null, `not JSON: ${out}`]; }
  const gotError = got !== null && typeof got === "object" ? got.error : undefined;
  if (want.rule !== undefined) {
    if (typeof gotError !== "string") return [null, `expected an error containing ${esc(want.rule)} (Lily's input rules), lily rendered ${out}`];
    if (!gotError.includes(want.rule)) return [null, `error text ${esc(gotError)} lacks ${esc(want.rule)}`];
    return ["lily-rule errors agree"];
  }
  if (want.raised !== undefined) {
    if (typeof gotError !== "string") return [null, `template raised ${esc(want.raised)}, lily rendered ${out}`];
    if (!gotError.includes(`chat template: ${want.raised}`)) return [null, `template raised ${esc(want.raised)}, lily's error is ${esc(gotError)}`];
    return ["template errors agree"];
  }
  if (typeof got !== "string") return [null, `template rendered, lily answered ${out}`];
  if (got !== want.prompt) return [null, "rendering differs\n" + describeDiff(want.prompt, got)];
  return ["renderings byte-identical"];
}
