// Shared harness of the OpenAI-client conformance tests: arguments, checkpoints, `lily serve` processes, HF tokenizer, chat rendering.
//
// Every *.test.mjs file in this folder is run directly by CTest:
//   node tests/oracle/openai/<name>.test.mjs --lily BUILD/lily --source /work/main
// (or with LILY_BIN / LILY_SOURCE_DIR in the environment). The npm packages come from
// `bash tests/oracle/openai/install.sh` (npm ci into tests/oracle/openai/node_modules).
//
// Expected values in the tests come from outside lily: the OpenAI client's own parsing and
// error classes, the HF tokenizers library (@anush008/tokenizers, the Rust `tokenizers`
// crate) over the checkpoint's tokenizer.json, the transformers goldens in tests/goldens,
// and the rules written in docs/api.md, docs/chat-format.md and docs/session-cache.md
// (rendering, budget, session cache). `renderChat` below is the checkpoint template's layout
// for the accepted API shape; the chat oracle (tests/oracle/chat) checks lily's renderer against
// real Jinja, and the tests here check the rendering against the golden prompt ids.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const MODEL_ID = 'Qwen3.6-35B-A3B';
export const INSTALL_HINT = 'run `bash tests/oracle/openai/install.sh` (npm ci into tests/oracle/openai/node_modules)';

function fatal(message) {
  console.error(`openai oracle: FAIL: ${message}`);
  process.exit(1);
}

function parseArgs(argv) {
  const opts = {
    lily: process.env.LILY_BIN,
    source: process.env.LILY_SOURCE_DIR || path.resolve(here, '..', '..', '..'),
  };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i];
    if (key === '--lily') opts.lily = argv[++i];
    else if (key === '--source') opts.source = argv[++i];
  }
  if (!opts.lily) fatal('usage: node <file>.test.mjs --lily PATH/TO/lily [--source REPO_ROOT]');
  if (!fs.existsSync(opts.lily)) fatal(`lily binary not found at ${opts.lily}`);
  return opts;
}

export const config = parseArgs(process.argv.slice(2));

// The pinned npm packages. A missing install is a failure that names the command to run.
let openaiModule;
let tokenizersModule;
try {
  openaiModule = await import('openai');
  tokenizersModule = await import('@anush008/tokenizers');
} catch (error) {
  fatal(`the npm packages are not installed (${String(error.message).split('\n')[0]}); ${INSTALL_HINT}`);
}
export const OpenAI = openaiModule.default;
const { Tokenizer } = tokenizersModule.default ?? tokenizersModule;

// ---- cleanup: servers and temporary folders never outlive the test process ----------------

const live = new Set();
const tempDirs = new Set();
const serverLogs = []; // [description, lines] of every server this process started
// Backstop: a server must never outlive the test process, whatever happened.
function killAll() {
  for (const proc of live) {
    try { proc.kill('SIGKILL'); } catch { /* already gone */ }
  }
  for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
}
process.on('exit', (code) => {
  killAll();
  // node:test sets a non-zero exit code when a test failed: show what the servers logged.
  if (code !== 0 || process.exitCode) {
    for (const [what, lines] of serverLogs) {
      const shown = lines.length > 80 ? [...lines.slice(0, 5), `[... ${lines.length - 65} lines ...]`, ...lines.slice(-60)] : lines;
      console.error(`---- stderr of ${what}\n${shown.join('\n')}`);
    }
  }
});
// CTest's timeout and Ctrl-C end this process with a signal, which skips 'exit' handlers.
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.on(signal, () => {
    killAll();
    process.exit(128 + { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 }[signal]);
  });
}

// ---- checkpoints ---------------------------------------------------------------------------

// Writes a tiny synthetic checkpoint into a fresh temporary folder; call remove() when done.
export function makeCheckpoint(seed = 1) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-openai-'));
  tempDirs.add(root);
  const dir = path.join(root, `tiny-seed${seed}`);
  const r = spawnSync(config.lily, ['make-checkpoint', '--profile', 'tiny', '--seed', String(seed), '--out', dir],
    { encoding: 'utf8' });
  if (r.status !== 0) {
    fs.rmSync(root, { recursive: true, force: true });
    throw new Error(`lily make-checkpoint failed (status ${r.status}): ${r.stderr}`);
  }
  return {
    dir,
    remove() {
      fs.rmSync(root, { recursive: true, force: true });
      tempDirs.delete(root);
    },
  };
}

export function loadGolden(name) {
  const file = path.join(config.source, 'tests', 'goldens', 'model', `${name}.json`);
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

// ---- servers -------------------------------------------------------------------------------

function serverEnv() {
  const env = { ...process.env };
  delete env.LILY_API_KEY; // would silently turn auth on
  delete env.LILY_MODEL;
  return env;
}

// Starts `lily serve --model DIR --bind 127.0.0.1:0 --threads 2 ARGS...` (with `strict: true`
// also `--strict`: Lily's contract exactly, docs/api.md; otherwise the default openai mode)
// and resolves once the "serving ... on http://127.0.0.1:PORT" line is printed, which must
// name that mode. Every stderr line is kept in `lines`. `threads: 1` for tests that time a
// long generation: the CPU thread pool spins for its workers, and with every core busy
// (CTest running suites in parallel) two threads decode many times slower than one.
export async function startServer(model, args = [], { readyTimeoutMs = 60000, strict = false, threads = 2 } = {}) {
  const argv = ['serve', '--model', model, '--bind', '127.0.0.1:0', '--threads', String(threads), ...args];
  if (strict) argv.push('--strict');
  const mode = strict || args.includes('--strict') ? 'strict' : 'openai';
  const proc = spawn(config.lily, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: serverEnv() });
  live.add(proc);
  const lines = [];
  const stamped = []; // the same lines with the time they arrived, for the failure dump
  serverLogs.push([`lily ${argv.join(' ')} (pid ${proc.pid}, started ${new Date().toISOString()})`, stamped]);
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      exited = { code, signal };
      stamped.push(`[${new Date().toISOString()}] (exited: code ${code}, signal ${signal})`);
      live.delete(proc);
      resolve(exited);
    });
  });
  const rl = readline.createInterface({ input: proc.stderr });
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`lily serve not ready after ${readyTimeoutMs} ms; stderr:\n${lines.join('\n')}`)),
      readyTimeoutMs);
    rl.on('line', (line) => {
      lines.push(line);
      stamped.push(`[${new Date().toISOString()}] ${line}`);
      const m = /^serving Qwen3\.6-35B-A3B on http:\/\/127\.0\.0\.1:(\d+) \(/.exec(line);
      if (m) {
        clearTimeout(timer);
        // A test of one API mode must never run against the other by accident.
        if (line.includes(`, ${mode} API, `)) resolve(Number(m[1]));
        else reject(new Error(`expected the ${mode} API, the server says: ${line}`));
      }
    });
    exitPromise.then((e) => {
      clearTimeout(timer);
      reject(new Error(`lily serve exited before it was ready (${JSON.stringify(e)}); stderr:\n${lines.join('\n')}`));
    });
  });
  let port;
  try {
    port = await ready;
  } catch (error) {
    if (!exited) proc.kill('SIGKILL');
    throw error;
  }
  const baseURL = `http://127.0.0.1:${port}/v1`;
  return {
    port,
    baseURL,
    lines,
    argv,
    get exited() { return exited; },
    client(options = {}) {
      // fetch that notes each request and its outcome next to the server's lines
      const loggedFetch = async (url, init) => {
        const what = `${init?.method ?? 'GET'} ${url}`;
        stamped.push(`[${new Date().toISOString()}] (client) ${what}`);
        try {
          const res = await fetch(url, init);
          stamped.push(`[${new Date().toISOString()}] (client) ${what} -> ${res.status}`);
          return res;
        } catch (error) {
          stamped.push(`[${new Date().toISOString()}] (client) ${what} -> ${error.name}: ${error.message}`);
          throw error;
        }
      };
      // A "Request timed out." here, with the server's log line for that request appearing
      // only when the client gave up, points at the transport (see the regression test in
      // transport.test.mjs), not at a slow model.
      return new OpenAI({ apiKey: 'unused', baseURL, maxRetries: 0, timeout: 60000, fetch: loggedFetch, ...options });
    },
    // Resolves with the first stderr line (from index `from` on) matching `re`.
    async waitForLine(re, from = 0, timeoutMs = 10000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const hit = lines.slice(from).find((l) => re.test(l));
        if (hit) return hit;
        if (Date.now() > deadline) throw new Error(`no stderr line matching ${re}; stderr:\n${lines.join('\n')}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    },
    // SIGTERM, then SIGKILL after 15 s; resolves with {code, signal}. Safe to call twice.
    async stop() {
      if (exited) return exited;
      proc.kill('SIGTERM');
      const timer = setTimeout(() => { if (!exited) proc.kill('SIGKILL'); }, 15000);
      const result = await exitPromise;
      clearTimeout(timer);
      return result;
    },
  };
}

// ---- HF tokenizer and the chat rendering ---------------------------------------------------

export function hfTokenizer(checkpointDir) {
  const tok = Tokenizer.fromFile(path.join(checkpointDir, 'tokenizer.json'));
  return {
    async encode(text) {
      return Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
    },
    async decode(ids) {
      return tok.decode(ids, true); // skip_special_tokens = true, as the server's content
    },
    // The vocabulary entry of an id (ByteLevel spelling: " k" is "Ġk"), and back.
    idToToken(id) {
      return tok.idToToken(id);
    },
    tokenToId(token) {
      return tok.tokenToId(token);
    },
  };
}

// GPT-2's ByteLevel alphabet: byte b <-> the character the vocabulary spells it with.
const BYTE_LEVEL = (() => {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const toChar = new Map(printable.map((b) => [b, String.fromCodePoint(b)]));
  let extra = 0;
  for (let b = 0; b < 256; b++) if (!toChar.has(b)) toChar.set(b, String.fromCodePoint(256 + extra++));
  return { toChar, toByte: new Map([...toChar].map(([b, c]) => [c, b])) };
})();

// The bytes a ByteLevel vocabulary entry stands for.
export function byteLevelBytes(token) {
  return Array.from(token, (c) => {
    const b = BYTE_LEVEL.toByte.get(c);
    if (b === undefined) throw new Error(`not a ByteLevel character: ${JSON.stringify(c)}`);
    return b;
  });
}

// The ByteLevel vocabulary spelling of bytes.
export function byteLevelToken(bytes) {
  return Array.from(bytes, (b) => BYTE_LEVEL.toChar.get(b)).join('');
}

export const EMPTY_THINK = '<think>\n\n</think>\n\n';
// Python's str.strip() set (Jinja2 `trim`): docs/chat-format.md "Whitespace".
const PY_WS = '\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const pyStrip = (s) => s.replace(new RegExp(`^[${PY_WS}]+|[${PY_WS}]+$`, 'gu'), '');

// docs/chat-format.md §3-§4 for the accepted API shape (string contents, optional leading system,
// last message user, no tool wrappers): thinking disabled, generation prompt added, and
// Lily's nothink history rewrite of assistant turns before the last user turn.
export function renderChat(messages) {
  let out = '';
  messages.forEach((m, i) => {
    if (m.role === 'system') {
      if (i !== 0) throw new Error('renderChat: system message must be first');
      out += `<|im_start|>system\n${pyStrip(m.content)}<|im_end|>\n`;
    } else if (m.role === 'user') {
      out += `<|im_start|>user\n${pyStrip(m.content)}<|im_end|>\n`;
    } else if (m.role === 'assistant') {
      const content = m.content.startsWith(EMPTY_THINK) ? m.content : EMPTY_THINK + m.content;
      out += `<|im_start|>assistant\n${pyStrip(content)}<|im_end|>\n`;
    } else {
      throw new Error(`renderChat: role ${m.role}`);
    }
  });
  if (messages.at(-1).role !== 'user') throw new Error('renderChat: last message must be user');
  return `${out}<|im_start|>assistant\n${EMPTY_THINK}`;
}

export async function promptIds(tokenizer, messages) {
  return tokenizer.encode(renderChat(messages));
}

export function isStrictPrefix(prefix, ids) {
  return prefix.length < ids.length && prefix.every((t, i) => ids[i] === t);
}

// Resolves with the rejection of `promise` (fails if it resolves); gives up after `ms` so a
// hanging call is a failure, not a stuck suite.
export async function rejection(promise, ms = 60000) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  try {
    const value = await Promise.race([promise, timeout]);
    throw Object.assign(new Error(`expected an error, got ${JSON.stringify(value)?.slice(0, 300)}`), { unexpectedSuccess: true });
  } catch (error) {
    if (error.unexpectedSuccess || /^no answer within/.test(error.message)) throw error;
    return error;
  } finally {
    clearTimeout(timer);
  }
}
