// OpenAI-client conformance of lily serve --strict: completion shape (Lily's bytes), the transformers golden through the API, /v1/models and 404s.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  OpenAI, MODEL_ID, makeCheckpoint, startServer, hfTokenizer, loadGolden, renderChat, promptIds,
  rejection,
} from './lib.mjs';

const CHESS = 'Name the two colors of a chessboard.';
const TEST = { timeout: 180000 };

function isCount(n) {
  return Number.isSafeInteger(n) && n >= 0;
}

// Everything the OpenAI chat.completion object promises, plus lily's exact field sets (docs/api.md).
function assertCompletionShape(c, { maxTokens, before: t0, after: t1 }) {
  assert.deepEqual(Object.keys(c), ['id', 'object', 'created', 'model', 'choices', 'usage']);
  assert.equal(typeof c.id, 'string');
  const id = /^chatcmpl-(\d+)-(\d+)$/.exec(c.id);
  assert.ok(id, `id ${c.id} is not chatcmpl-<created>-<n>`);
  assert.equal(c.object, 'chat.completion');
  assert.ok(Number.isSafeInteger(c.created), `created ${c.created} is not an integer`);
  assert.ok(c.created >= t0 - 5 && c.created <= t1 + 5, `created ${c.created} not within 5 s of [${t0}, ${t1}]`);
  assert.equal(Number(id[1]), c.created, 'the id embeds created');
  assert.ok(Number(id[2]) >= 1, 'the id counter starts at 1');
  assert.equal(c.model, MODEL_ID);
  assert.equal(c.system_fingerprint, undefined);
  assert.ok(Array.isArray(c.choices));
  assert.equal(c.choices.length, 1);
  const [choice] = c.choices;
  assert.deepEqual(Object.keys(choice), ['index', 'message', 'finish_reason']);
  assert.equal(choice.index, 0);
  assert.equal(choice.logprobs, undefined);
  assert.deepEqual(Object.keys(choice.message), ['role', 'content']);
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason), `finish_reason ${choice.finish_reason}`);
  const u = c.usage;
  assert.deepEqual(Object.keys(u), ['prompt_tokens', 'completion_tokens', 'total_tokens', 'prompt_tokens_details']);
  assert.deepEqual(Object.keys(u.prompt_tokens_details), ['cached_tokens']);
  for (const n of [u.prompt_tokens, u.completion_tokens, u.total_tokens, u.prompt_tokens_details.cached_tokens]) {
    assert.ok(isCount(n), `usage value ${n} is not a non-negative integer`);
  }
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= maxTokens);
  assert.ok(u.prompt_tokens_details.cached_tokens < u.prompt_tokens, 'a cache hit always prefills at least one token');
  // length iff the limit was reached without a stop token (a stop token is counted but not shown)
  if (choice.finish_reason === 'length') assert.equal(u.completion_tokens, maxTokens);
  return Number(id[2]);
}

const now = () => Math.floor(Date.now() / 1000);

describe('chat completion through the OpenAI client (tiny seed-1 checkpoint)', () => {
  let ckpt;
  let server;
  let client;
  let tok;
  const golden = loadGolden('tiny-seed1-chat');

  before(async () => {
    ckpt = makeCheckpoint(1);
    tok = hfTokenizer(ckpt.dir);
    server = await startServer(ckpt.dir, [], { strict: true });
    client = server.client();
  });
  after(async () => {
    if (server) {
      const exit = await server.stop();
      assert.deepEqual(exit, { code: 0, signal: null }, `SIGTERM should stop the server with exit 0; stderr:\n${server.lines.join('\n')}`);
    }
    ckpt?.remove();
  });

  it('prints the listening line before the serving line, on the same port', () => {
    const listening = server.lines.findIndex((l) => l.startsWith(`listening on http://127.0.0.1:${server.port} (`));
    const serving = server.lines.findIndex((l) => l.startsWith(`serving ${MODEL_ID} on http://127.0.0.1:${server.port} (`));
    assert.ok(listening >= 0 && serving > listening, server.lines.join('\n'));
  });

  it('the HF tokenizer encoding of the rendered chess prompt is the golden prompt_ids', TEST, async () => {
    // Checks this harness (renderChat + tokenizer.json) against transformers' prompt ids, so the
    // prompt_tokens expectations below and in cache.test.mjs stand on an outside reference.
    const rendered = renderChat([{ role: 'user', content: CHESS }]);
    assert.deepEqual(await tok.encode(rendered), golden.prompt_ids);
  });

  it('greedy 32 tokens of the chess question equal the transformers golden', TEST, async () => {
    assert.equal(golden.checkpoint.seed, 1);
    assert.equal(golden.tokens.length, 32);
    const from = server.lines.length;
    const t0 = now();
    const c = await client.chat.completions.create({
      model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], max_tokens: 32,
    });
    assertCompletionShape(c, { maxTokens: 32, before: t0, after: now() });
    assert.equal(c.usage.prompt_tokens, golden.prompt_ids.length);
    assert.equal(c.usage.completion_tokens, 32);
    assert.equal(c.usage.total_tokens, golden.prompt_ids.length + 32);
    assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0, 'first request of a fresh server');
    // None of the golden tokens is a stop token, so the 32-token limit ends it.
    assert.equal(c.choices[0].finish_reason, 'length');
    // Expected text: HF tokenizers' decode(golden tokens, skip_special_tokens=true). Its
    // ByteLevel decoder joins the tokens' bytes and applies String::from_utf8_lossy, which
    // writes one U+FFFD per maximal invalid byte sequence; the server writes its decoded
    // bytes with nlohmann's error_handler_t::replace, which replaces the same sequences. The
    // golden output does contain such sequences (its text has U+FFFD), so this compares the
    // replacement as well as the valid text, code unit for code unit.
    const expected = await tok.decode(golden.tokens);
    assert.ok(expected.includes('\uFFFD'), 'the golden decode exercises the U+FFFD path');
    assert.equal(c.choices[0].message.content, expected);
    // Lily's log format (docs/server.md, *One request*): one line per request with these counts.
    const line = await server.waitForLine(/^POST \/v1\/chat\/completions 200 /, from);
    assert.match(line, new RegExp(`^POST /v1/chat/completions 200 \\d+ms prompt=${golden.prompt_ids.length} cached=0 completion=32 tok/s=\\d+\\.\\d$`));
  });

  it('the raw body is compact JSON with non-ASCII written raw and control characters escaped', TEST, async () => {
    // docs/api.md: compact, UTF-8, valid non-ASCII not \u-escaped. Same request as the golden
    // test (a repeat is a cache miss: the cached entry is longer than this prompt).
    const res = await fetch(`${server.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], max_tokens: 32 }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^application\/json/);
    const raw = await res.text();
    const body = JSON.parse(raw);
    assert.equal(JSON.stringify(body), raw, 'compact, in field order, no escapes beyond JSON.stringify\'s');
    const expected = await tok.decode(golden.tokens);
    assert.equal(body.choices[0].message.content, expected);
    assert.equal(body.usage.prompt_tokens_details.cached_tokens, 0);
  });

  it('a second request has every field, a fresh id and prompt_tokens from the HF tokenizer', TEST, async () => {
    const messages = [
      { role: 'system', content: 'You answer in one word.' },
      { role: 'user', content: 'Hello there, who are you?' },
    ];
    const t0 = now();
    const a = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 3 });
    const b = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 3, prompt_cache_key: null });
    const t1 = now();
    const na = assertCompletionShape(a, { maxTokens: 3, before: t0, after: t1 });
    const nb = assertCompletionShape(b, { maxTokens: 3, before: t0, after: t1 });
    assert.equal(nb, na + 1, 'the per-process id counter counts completions');
    const expectedPrompt = (await promptIds(tok, messages)).length;
    assert.equal(a.usage.prompt_tokens, expectedPrompt);
    assert.equal(b.usage.prompt_tokens, expectedPrompt);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content, 'greedy decoding is deterministic');
  });

  it('GET /v1/models lists exactly the one model', TEST, async () => {
    const page = await client.models.list();
    assert.equal(page.object, 'list');
    assert.deepEqual(page.data, [{ id: MODEL_ID, object: 'model', created: 0, owned_by: 'lily' }]);
    const all = [];
    for await (const m of client.models.list()) all.push(m.id);
    assert.deepEqual(all, [MODEL_ID]);
  });

  it('models.retrieve is a clean 404 envelope (/v1/models/{id} is not served)', TEST, async () => {
    const err = await rejection(client.models.retrieve(MODEL_ID));
    assert.ok(err instanceof OpenAI.NotFoundError, `expected NotFoundError, got ${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, 404);
    assert.deepEqual(err.error, { message: 'not found', type: 'invalid_request_error', param: null, code: null });
    assert.equal(err.type, 'invalid_request_error');
    assert.equal(err.param, null);
    assert.equal(err.code, null);
  });

  it('legacy /v1/completions is a clean 404 envelope', TEST, async () => {
    const err = await rejection(client.completions.create({ model: MODEL_ID, prompt: 'hi', max_tokens: 1 }));
    assert.ok(err instanceof OpenAI.NotFoundError, `expected NotFoundError, got ${err.constructor.name}: ${err.message}`);
    assert.deepEqual(err.error, { message: 'not found', type: 'invalid_request_error', param: null, code: null });
  });

  it('a wrong method on a known path is 405 with the envelope', TEST, async () => {
    const err = await rejection(client.get('/chat/completions'));
    assert.ok(err instanceof OpenAI.APIError, `got ${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, 405);
    assert.deepEqual(err.error, { message: 'method not allowed', type: 'invalid_request_error', param: null, code: null });
  });

  it('/health answers ok', TEST, async () => {
    const res = await fetch(`http://127.0.0.1:${server.port}/health`);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { status: 'ok' });
  });
});
