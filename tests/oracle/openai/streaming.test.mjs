// OpenAI-client conformance of lily serve's streams (default openai mode): for await over chunks, include_usage, the stream() helper, abort, errors before and inside a stream.
//
// What is expected comes from outside lily: the official client's own SSE parsing and its
// ChatCompletionStream accumulator (which refuses chunks it cannot place), its error classes,
// the transformers golden (greedy tokens of the chess prompt, decoded by HF tokenizers), and
// OpenAI's wire format (docs/api.md, docs/clients.md).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { OpenAI, MODEL_ID, makeCheckpoint, startServer, hfTokenizer, loadGolden, rejection } from './lib.mjs';

const CHESS = 'Name the two colors of a chessboard.';
const TEST = { timeout: 180000 };
const golden = loadGolden('tiny-seed1-chat');
const ENDOFTEXT = '<|endoftext|>';
const IM_END = '<|im_end|>';

// A raw fetch of the same request: the SSE events as sent (for counting what the client saw).
async function rawEvents(baseURL, body) {
  const res = await fetch(`${baseURL}/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  const text = await res.text();
  const events = text.split('\n\n');
  assert.equal(events.pop(), '', 'the body ends with a blank line');
  return events.map((e) => {
    assert.ok(e.startsWith('data: '), e);
    return e.slice(6);
  });
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// OpenAI's chunk sequence: same id/created/model, role chunk, content chunks, finish chunk,
// then (include_usage) a usage chunk with choices [] and usage null on every other chunk.
function assertChunkSequence(chunks, { includeUsage }) {
  assert.ok(chunks.length >= 2);
  const [first] = chunks;
  assert.match(first.id, /^chatcmpl-\d+-\d+$/);
  for (const c of chunks) {
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.id, first.id);
    assert.equal(c.created, first.created);
    assert.equal(c.model, MODEL_ID);
    if (includeUsage) assert.ok('usage' in c, 'every chunk carries usage (null but the last)');
    else assert.ok(!('usage' in c), 'no usage key without include_usage');
  }
  const choiceChunks = includeUsage ? chunks.slice(0, -1) : chunks;
  for (const c of choiceChunks) {
    assert.equal(c.choices.length, 1);
    assert.equal(c.choices[0].index, 0);
    if (includeUsage) assert.equal(c.usage, null);
  }
  assert.deepEqual(first.choices[0], { index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null });
  const last = choiceChunks.at(-1).choices[0];
  assert.deepEqual(last.delta, {});
  assert.ok(['stop', 'length'].includes(last.finish_reason));
  for (const c of choiceChunks.slice(1, -1)) {
    assert.deepEqual(Object.keys(c.choices[0].delta), ['content']);
    assert.equal(c.choices[0].finish_reason, null);
  }
  if (includeUsage) {
    const u = chunks.at(-1);
    assert.deepEqual(u.choices, []);
    assert.equal(u.usage.total_tokens, u.usage.prompt_tokens + u.usage.completion_tokens);
  }
  return {
    content: choiceChunks.slice(1, -1).map((c) => c.choices[0].delta.content).join(''),
    finishReason: last.finish_reason,
    usage: includeUsage ? chunks.at(-1).usage : undefined,
  };
}

describe('streamed chat completions through the OpenAI client (tiny seed-1 checkpoint)', () => {
  let ckpt;
  let server;
  let client;
  let tok;
  let banStops; // logit_bias that bans the stop tokens: the answer runs to max_tokens

  before(async () => {
    ckpt = makeCheckpoint(1);
    tok = hfTokenizer(ckpt.dir);
    banStops = { [tok.tokenToId(ENDOFTEXT)]: -100, [tok.tokenToId(IM_END)]: -100 };
    server = await startServer(ckpt.dir, [], { threads: 1 });
    client = server.client();
  });
  after(async () => {
    if (server) {
      const exit = await server.stop();
      assert.deepEqual(exit, { code: 0, signal: null }, server.lines.join('\n'));
    }
    ckpt?.remove();
  });

  const CHESS_32 = { model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], max_tokens: 32 };

  it('for await over the stream: every chunk parsed, the greedy text is the transformers golden', TEST, async () => {
    const stream = await client.chat.completions.create({ ...CHESS_32, stream: true });
    assert.equal(typeof stream[Symbol.asyncIterator], 'function');
    assert.ok(stream.controller instanceof AbortController);
    const chunks = await collect(stream);
    const got = assertChunkSequence(chunks, { includeUsage: false });
    assert.equal(got.content, await tok.decode(golden.tokens));
    assert.equal(got.finishReason, 'length');
    const plain = await client.chat.completions.create(CHESS_32);
    assert.equal(got.content, plain.choices[0].message.content);
    // The client yielded one object per event the server sent, [DONE] excluded.
    const raw = await rawEvents(server.baseURL, { ...CHESS_32, stream: true });
    assert.equal(raw.at(-1), '[DONE]');
    assert.equal(chunks.length, raw.length - 1);
    assert.deepEqual(raw.slice(0, -1).map((e) => JSON.parse(e).choices), chunks.map((c) => c.choices));
  });

  it('with stream_options.include_usage: the usage chunk equals the non-streamed usage', TEST, async () => {
    for (const [content, maxTokens] of [[CHESS, 12], ['Usage please', 5], ['Question 3973', 4]]) {
      const req = { model: MODEL_ID, messages: [{ role: 'user', content }], max_tokens: maxTokens };
      const plain = await client.chat.completions.create(req);
      const chunks = await collect(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
      const got = assertChunkSequence(chunks, { includeUsage: true });
      // The same prompt again reuses the session-cache snapshot taken where the first one's
      // prompt ended before its generation prompt (docs/server.md); the rest is identical.
      const generationPrompt = (await tok.encode('<|im_start|>assistant\n<think>\n\n</think>\n\n')).length;
      assert.deepEqual(got.usage, {
        ...plain.usage,
        prompt_tokens_details: { cached_tokens: plain.usage.prompt_tokens - generationPrompt },
      }, content);
      assert.equal(got.content, plain.choices[0].message.content);
      assert.equal(got.finishReason, plain.choices[0].finish_reason);
    }
  });

  it('the client\'s stream() helper accumulates the same completion, usage and logprobs', TEST, async () => {
    const req = { ...CHESS_32, logprobs: true, top_logprobs: 2 };
    const plain = await client.chat.completions.create(req);
    const runner = client.chat.completions.stream({ ...req, stream_options: { include_usage: true } });
    let deltas = '';
    let chunkCount = 0;
    runner.on('content', (delta) => { deltas += delta; });
    runner.on('chunk', () => { chunkCount += 1; });
    const final = await runner.finalChatCompletion();
    const [choice] = final.choices;
    assert.equal(choice.message.role, 'assistant');
    assert.equal(choice.message.content, plain.choices[0].message.content);
    assert.equal(deltas, plain.choices[0].message.content);
    assert.equal(choice.finish_reason, 'length');
    // The same prompt again: the snapshot where the first prompt ended before its generation
    // prompt is reused (docs/server.md); the counts are the same.
    const generationPrompt = (await tok.encode('<|im_start|>assistant\n<think>\n\n</think>\n\n')).length;
    assert.deepEqual(final.usage, {
      ...plain.usage,
      prompt_tokens_details: { cached_tokens: plain.usage.prompt_tokens - generationPrompt },
    });
    assert.deepEqual(choice.logprobs.content, plain.choices[0].logprobs.content);
    assert.equal(choice.logprobs.content.length, 32);
    assert.equal(chunkCount, 1 + 32 + 1 + 1, 'role, one chunk per token, finish, usage');
    assert.equal(await runner.finalContent(), plain.choices[0].message.content);
  });

  it('an error before the stream starts rejects create() with BadRequestError (no stream)', TEST, async () => {
    const cases = [
      [{ temperature: 3 }, 'temperature', 'parsing chat request: temperature must be a number in [0, 2], found number 3'],
      [{ top_logprobs: 2 }, 'top_logprobs', 'top_logprobs requires logprobs: true'],
      [{ n: 2 }, 'n', 'n > 1 is not supported'],
    ];
    for (const [fields, param, message] of cases) {
      const err = await rejection(client.chat.completions.create({ ...CHESS_32, stream: true, ...fields }));
      assert.ok(err instanceof OpenAI.BadRequestError, `${err.constructor.name}: ${err.message}`);
      assert.deepEqual(err.error, { message, type: 'invalid_request_error', param, code: null });
    }
    const runner = client.chat.completions.stream({ ...CHESS_32, temperature: -1 });
    runner.on('error', () => {}); // the rejection below is what is checked
    const err = await rejection(runner.finalChatCompletion());
    assert.ok(err instanceof OpenAI.BadRequestError, `${err.constructor.name}: ${err.message}`);
    assert.equal(err.param, 'temperature');
  });

  it('breaking out of for await cancels the request on the server within a step', TEST, async () => {
    // The decode rate of this server, to bound "at once" relative to the whole long request.
    const long = { model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], temperature: 0, logit_bias: banStops };
    let t0 = Date.now();
    await client.chat.completions.create({ ...long, max_tokens: 200 });
    const msPerToken = (Date.now() - t0) / 200;
    const longMs = 3000 * msPerToken;
    const from = server.lines.length;
    const stream = await client.chat.completions.create({ ...long, max_tokens: 3000, stream: true });
    let seen = 0;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) {
        seen += 1;
        break; // the client aborts the HTTP request
      }
    }
    assert.equal(seen, 1);
    t0 = Date.now();
    const next = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Next' }], max_tokens: 2 });
    const waited = Date.now() - t0;
    assert.equal(next.usage.completion_tokens, 2);
    assert.ok(waited < 0.2 * longMs, `the next request waited ${waited} ms; the long one runs about ${Math.round(longMs)} ms`);
    const line = await server.waitForLine(/^POST \/v1\/chat\/completions 499 /, from);
    assert.match(line, /^POST \/v1\/chat\/completions 499 \d+ms prompt=\d+ cached=\d+ completion=\d+ tok\/s=\d+\.\d error="client disconnected"$/);
    const completion = Number(/completion=(\d+)/.exec(line)[1]);
    assert.ok(completion < 600, line);
  });

  it('controller.abort() ends the iteration quietly and cancels the request', TEST, async () => {
    const from = server.lines.length;
    const stream = await client.chat.completions.create({
      model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], temperature: 0, logit_bias: banStops, max_tokens: 3000, stream: true,
    });
    const chunks = [];
    for await (const chunk of stream) {
      chunks.push(chunk);
      if (chunks.length === 3) stream.controller.abort();
    }
    // The loop ends without an error; at most what the client had already parsed follows.
    assert.ok(chunks.length >= 3 && chunks.length < 100, `${chunks.length} chunks`);
    await server.waitForLine(/^POST \/v1\/chat\/completions 499 \d+ms .* error="client disconnected"$/, from, 30000);
  });
});

describe('an error inside a stream (the server stops while a stream waits in the queue)', () => {
  it('the client\'s iterator throws APIError with the error the server sent; the running stream completes', TEST, async () => {
    const ckpt = makeCheckpoint(1);
    const tok = hfTokenizer(ckpt.dir);
    const server = await startServer(ckpt.dir, [], { threads: 1 });
    try {
      const client = server.client();
      const banStops = { [tok.tokenToId(ENDOFTEXT)]: -100, [tok.tokenToId(IM_END)]: -100 };
      const running = await client.chat.completions.create({
        model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], temperature: 0, logit_bias: banStops, max_tokens: 120, stream: true,
      });
      const runningIt = running[Symbol.asyncIterator]();
      assert.deepEqual((await runningIt.next()).value.choices[0].delta, { role: 'assistant', content: '' });
      assert.ok((await runningIt.next()).value.choices[0].delta.content !== undefined);
      // Queued behind it: the role chunk (and the headers) arrive at once.
      const queued = await client.chat.completions.create({
        model: MODEL_ID, messages: [{ role: 'user', content: 'Queued' }], max_tokens: 4, stream: true,
      });
      const queuedIt = queued[Symbol.asyncIterator]();
      assert.deepEqual((await queuedIt.next()).value.choices[0].delta, { role: 'assistant', content: '' });
      const stopping = server.stop(); // SIGTERM: queued requests fail, the running one finishes
      const err = await rejection(queuedIt.next());
      assert.ok(err instanceof OpenAI.APIError, `${err.constructor.name}: ${err.message}`);
      assert.deepEqual(err.error, { message: 'server is shutting down', type: 'server_error', param: null, code: 'shutting_down' });
      assert.equal(err.code, 'shutting_down');
      let finish = null;
      let tokens = 0;
      for (;;) {
        const { value, done } = await runningIt.next();
        if (done) break;
        if (value.choices[0].delta.content !== undefined) tokens += 1;
        finish = value.choices[0].finish_reason ?? finish;
      }
      assert.equal(finish, 'length');
      assert.ok(tokens >= 1);
      assert.deepEqual(await stopping, { code: 0, signal: null }, server.lines.join('\n'));
      assert.ok(server.lines.some((l) => /^POST \/v1\/chat\/completions 503 \d+ms error="server is shutting down"$/.test(l)), server.lines.join('\n'));
      assert.ok(server.lines.some((l) => /^POST \/v1\/chat\/completions 200 \d+ms prompt=\d+ cached=0 completion=120 /.test(l)), server.lines.join('\n'));
    } finally {
      await server.stop();
      ckpt.remove();
    }
  });
});
