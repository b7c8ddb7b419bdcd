// OpenAI-client conformance of lily serve --strict: every refused field and value is a 400 the client raises as BadRequestError, with the OpenAI envelope.
//
// Strict mode is Lily's contract (unknown fields refused, no streaming); the default openai
// mode's refusals are in sampling.test.mjs and tests/server/test_sse.py.
//
// Expected statuses, params, codes and messages are docs/api.md's validation table (Lily's
// order) and its error envelope; the prompt lengths behind the budget checks come from the HF
// tokenizer over docs/chat-format.md's rendering (lib.mjs renderChat), not from the server.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { OpenAI, MODEL_ID, makeCheckpoint, startServer, hfTokenizer, promptIds, rejection } from './lib.mjs';

const MAX_SEQ = 40;
const USER = [{ role: 'user', content: 'Hi there.' }];
const BASE = { model: MODEL_ID, messages: USER, max_tokens: 1 };
const EXPECTED_FIELDS = '"model", "messages", "max_tokens", "stream", "prompt_cache_key"';
const TEST = { timeout: 60000 };

// Asserts `err` is the client's class for the status and carries the OpenAI envelope.
function assertApiError(err, { status = 400, param = null, code = null, type = 'invalid_request_error', message }) {
  const cls = { 400: OpenAI.BadRequestError, 401: OpenAI.AuthenticationError, 404: OpenAI.NotFoundError }[status] ?? OpenAI.APIError;
  assert.ok(err instanceof cls, `expected ${cls.name} (${status}), got ${err.constructor.name}: ${err.message}`);
  assert.equal(err.status, status);
  assert.ok(err.error && typeof err.error === 'object', `no error envelope: ${err.message}`);
  assert.deepEqual(Object.keys(err.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(typeof err.error.message, 'string');
  assert.equal(err.type, type);
  assert.equal(err.param, param);
  assert.equal(err.code, code);
  if (typeof message === 'string') assert.equal(err.error.message, message);
  else if (message) assert.match(err.error.message, message);
}

describe('refused requests through the OpenAI client', () => {
  let ckpt;
  let server;
  let client;
  let tok;
  let userPromptTokens;

  // POSTs a raw body (for what JSON.stringify / the typed client cannot write) and returns
  // the error the client would raise for that answer.
  async function rawError(body) {
    const res = await fetch(`${server.baseURL}/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body,
    });
    const text = await res.text();
    let json;
    try { json = JSON.parse(text); } catch { json = undefined; }
    return OpenAI.APIError.generate(res.status, json, text, res.headers);
  }

  before(async () => {
    ckpt = makeCheckpoint(1);
    tok = hfTokenizer(ckpt.dir);
    userPromptTokens = (await promptIds(tok, USER)).length;
    server = await startServer(ckpt.dir, ['--max-seq', String(MAX_SEQ)], { strict: true });
    client = server.client();
  });
  after(async () => {
    if (server) {
      const exit = await server.stop();
      assert.deepEqual(exit, { code: 0, signal: null }, server.lines.join('\n'));
    }
    ckpt?.remove();
  });

  it('the base request is accepted (so every refusal below is due to its one change)', TEST, async () => {
    const c = await client.chat.completions.create(BASE);
    assert.equal(c.usage.prompt_tokens, userPromptTokens);
    assert.equal(c.usage.completion_tokens, 1);
  });

  describe('unknown top-level fields (step 1e: param is the field, code null)', () => {
    const cases = {
      temperature: 0.7,
      top_p: 0.9,
      n: 1,
      stop: ['\n'],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }],
      tool_choice: 'none',
      response_format: { type: 'json_object' },
      seed: 42,
      logprobs: false,
      max_completion_tokens: 8,
      stream_options: { include_usage: true },
      user: 'someone',
      frequency_penalty: 0,
      presence_penalty: 0,
      chat_template_kwargs: { enable_thinking: false },
    };
    for (const [field, value] of Object.entries(cases)) {
      it(`${field}: ${JSON.stringify(value)}`, TEST, async () => {
        const err = await rejection(client.chat.completions.create({ ...BASE, [field]: value }));
        assertApiError(err, {
          param: field,
          message: `parsing chat request: unknown field "${field}", expected one of ${EXPECTED_FIELDS}`,
        });
      });
    }
    it('even a null value (temperature: null, seed: null)', TEST, async () => {
      for (const field of ['temperature', 'seed']) {
        const err = await rejection(client.chat.completions.create({ ...BASE, [field]: null }));
        assertApiError(err, { param: field, message: new RegExp(`^parsing chat request: unknown field "${field}"`) });
      }
    });
    it('sent through the client\'s body override too', TEST, async () => {
      const err = await rejection(client.chat.completions.create(BASE, { body: { ...BASE, temperature: 0 } }));
      assertApiError(err, { param: 'temperature', message: /^parsing chat request: unknown field "temperature"/ });
    });
  });

  describe('messages (step 1f: param messages, code null)', () => {
    const cases = [
      ['message-level name', [{ role: 'user', content: 'hi', name: 'bob' }], /messages\[0\]: unknown field "name"/],
      ['message-level tool_calls', [{ role: 'user', content: 'hi', tool_calls: [] }], /messages\[0\]: unknown field "tool_calls"/],
      ['message-level reasoning_content', [{ role: 'assistant', content: 'a', reasoning_content: '' }, { role: 'user', content: 'hi' }],
        /messages\[0\]: unknown field "reasoning_content"/],
      ['role tool', [{ role: 'tool', content: 'x', tool_call_id: 'c' }, { role: 'user', content: 'hi' }], /messages\[0\]/],
      ['role tool alone', [{ role: 'user', content: 'hi' }, { role: 'tool', content: 'x' }],
        /messages\[1\]\.role must be "system", "user" or "assistant", found string "tool"/],
      ['role developer', [{ role: 'developer', content: 'be brief' }, { role: 'user', content: 'hi' }],
        /messages\[0\]\.role must be "system", "user" or "assistant", found string "developer"/],
      ['role User (case)', [{ role: 'User', content: 'hi' }], /messages\[0\]\.role must be "system", "user" or "assistant"/],
      ['array (multimodal) content', [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
        /messages\[0\]\.content must be a string, found array/],
      ['null content', [{ role: 'user', content: null }], /messages\[0\]\.content must be a string, found null/],
      ['number content', [{ role: 'user', content: 5 }], /messages\[0\]\.content must be a string, found number/],
      ['missing content', [{ role: 'user' }], /messages\[0\]/],
      ['messages not an array', 'hi', /messages/],
    ];
    for (const [name, messages, message] of cases) {
      it(name, TEST, async () => {
        const err = await rejection(client.chat.completions.create({ ...BASE, messages }));
        assertApiError(err, { param: 'messages', message: new RegExp(`^parsing chat request: .*${message.source}`) });
      });
    }
  });

  describe('max_tokens', () => {
    it('0 is refused at step 6', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, max_tokens: 0 }));
      assertApiError(err, { param: 'max_tokens', message: 'max_tokens must be greater than zero' });
    });
    for (const value of [-1, 1.5, '5', true]) {
      it(`${JSON.stringify(value)} is not a non-negative integer (step 1f)`, TEST, async () => {
        const err = await rejection(client.chat.completions.create({ ...BASE, max_tokens: value }));
        assertApiError(err, {
          param: 'max_tokens',
          message: /^parsing chat request: max_tokens must be a non-negative integer \(at most 18446744073709551615\), found /,
        });
      });
    }
    for (const literal of ['1.0', '1e3', '-0.0', '18446744073709551616']) {
      it(`the literal ${literal} (raw body) is refused before any conversion`, TEST, async () => {
        const err = await rawError(`{"model":"${MODEL_ID}","messages":[{"role":"user","content":"Hi there."}],"max_tokens":${literal}}`);
        assertApiError(err, { param: 'max_tokens', message: /^parsing chat request: max_tokens must be a non-negative integer/ });
      });
    }
    it('the literal -0 (raw body) reads as 0 and gets the step-6 error', TEST, async () => {
      const err = await rawError(`{"model":"${MODEL_ID}","messages":[{"role":"user","content":"Hi there."}],"max_tokens":-0}`);
      assertApiError(err, { param: 'max_tokens', message: 'max_tokens must be greater than zero' });
    });
    it('2^64-1 (raw body) overflows the token count (step 9a)', TEST, async () => {
      const err = await rawError(`{"model":"${MODEL_ID}","messages":[{"role":"user","content":"Hi there."}],"max_tokens":18446744073709551615}`);
      assertApiError(err, { param: 'max_tokens', message: 'request token count overflow' });
    });
  });

  describe('the budget: prompt + max_tokens + 1 <= max_seq', () => {
    it('the largest max_tokens that fits is accepted', TEST, async () => {
      const fits = MAX_SEQ - userPromptTokens - 1;
      assert.ok(fits >= 1 && fits <= 30, `MAX_SEQ ${MAX_SEQ} leaves ${fits} tokens for a ${userPromptTokens}-token prompt`);
      const c = await client.chat.completions.create({ ...BASE, max_tokens: fits });
      assert.equal(c.usage.prompt_tokens, userPromptTokens);
      assert.ok(c.usage.completion_tokens <= fits);
      if (c.choices[0].finish_reason === 'length') assert.equal(c.usage.completion_tokens, fits);
    });
    it('one more is context_length_exceeded', TEST, async () => {
      const tooMany = MAX_SEQ - userPromptTokens;
      const err = await rejection(client.chat.completions.create({ ...BASE, max_tokens: tooMany }));
      assertApiError(err, {
        param: 'messages', code: 'context_length_exceeded',
        message: `request needs ${MAX_SEQ + 1} tokens but server max_seq is ${MAX_SEQ}`,
      });
    });
    it('the default max_tokens is 128 and is never shortened to fit', TEST, async () => {
      const { max_tokens: _drop, ...noMax } = BASE;
      const err = await rejection(client.chat.completions.create(noMax));
      assertApiError(err, {
        param: 'messages', code: 'context_length_exceeded',
        message: `request needs ${userPromptTokens + 128 + 1} tokens but server max_seq is ${MAX_SEQ}`,
      });
    });
    it('a prompt longer than max_seq is context_length_exceeded', TEST, async () => {
      const messages = [{ role: 'user', content: 'word '.repeat(60).trim() }];
      const prompt = (await promptIds(tok, messages)).length;
      assert.ok(prompt > MAX_SEQ);
      const err = await rejection(client.chat.completions.create({ ...BASE, messages }));
      assertApiError(err, {
        param: 'messages', code: 'context_length_exceeded',
        message: `request needs ${prompt + 2} tokens but server max_seq is ${MAX_SEQ}`,
      });
    });
  });

  describe('stream, messages, model (steps 2-7)', () => {
    it('stream: true rejects the client\'s streaming call with a 400, it does not hang', TEST, async () => {
      const err = await rejection((async () => {
        const stream = await client.chat.completions.create({ ...BASE, stream: true });
        for await (const _chunk of stream) { /* must not get here */ }
        return 'a stream';
      })(), 20000);
      assertApiError(err, { param: 'stream', message: 'streaming is not supported' });
    });
    it('the client\'s stream() helper fails too', TEST, async () => {
      const stream = client.chat.completions.stream({ ...BASE });
      stream.on('error', () => {}); // the rejection below is what is checked
      const err = await rejection(stream.finalChatCompletion(), 20000);
      assertApiError(err, { param: 'stream', message: 'streaming is not supported' });
    });
    it('stream: false is accepted', TEST, async () => {
      const c = await client.chat.completions.create({ ...BASE, stream: false });
      assert.equal(c.object, 'chat.completion');
    });
    it('stream: "yes" is a type error', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, stream: 'yes' }));
      assertApiError(err, { param: 'stream', message: /^parsing chat request: stream must be true or false, found / });
    });
    it('empty messages', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, messages: [] }));
      assertApiError(err, { param: 'messages', message: 'messages must not be empty' });
    });
    it('final role assistant', TEST, async () => {
      const err = await rejection(client.chat.completions.create({
        ...BASE, messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Hello' }],
      }));
      assertApiError(err, { param: 'messages', message: 'the final message must have role=user, found role=assistant' });
    });
    it('final role system', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, messages: [{ role: 'system', content: 's' }] }));
      assertApiError(err, { param: 'messages', message: 'the final message must have role=user, found role=system' });
    });
    it('a system message after the first is refused by the chat template (step 7)', TEST, async () => {
      const err = await rejection(client.chat.completions.create({
        ...BASE, messages: [{ role: 'user', content: 'a' }, { role: 'system', content: 's' }, { role: 'user', content: 'b' }],
      }));
      assertApiError(err, { param: 'messages', message: /^rendering chat template: .*System message must be at the beginning\./ });
    });
    it('prompt_cache_key must be a string or null', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, prompt_cache_key: 7 }));
      assertApiError(err, { param: 'prompt_cache_key', message: /^parsing chat request: prompt_cache_key must be a string or null, found / });
    });
  });

  describe('model', () => {
    for (const model of ['gpt-4o', 'qwen3.6-35b-a3b', `${MODEL_ID} `, '']) {
      it(`${JSON.stringify(model)} is 400 model_not_found (BadRequestError, not NotFoundError)`, TEST, async () => {
        const err = await rejection(client.chat.completions.create({ ...BASE, model }));
        assertApiError(err, {
          param: 'model', code: 'model_not_found',
          message: `unknown model ${JSON.stringify(model)}; this server exposes only ${MODEL_ID}`,
        });
        assert.ok(!(err instanceof OpenAI.NotFoundError));
      });
    }
    it('a missing model is a parse error', TEST, async () => {
      const { model: _drop, ...noModel } = BASE;
      const err = await rejection(client.chat.completions.create(noModel));
      assertApiError(err, { param: 'model', message: 'parsing chat request: missing field "model"' });
    });
    it('a non-string model is a type error', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, model: 5 }));
      assertApiError(err, { param: 'model', message: 'parsing chat request: model must be a string, found number 5' });
    });
  });

  describe('validation order (first failure wins, Lily\'s steps)', () => {
    it('unknown field before wrong model', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, model: 'gpt-4o', temperature: 1 }));
      assertApiError(err, { param: 'temperature', message: /^parsing chat request: unknown field "temperature"/ });
    });
    it('wrong model before stream: true', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, model: 'gpt-4o', stream: true }));
      assertApiError(err, { param: 'model', code: 'model_not_found', message: /^unknown model "gpt-4o"/ });
    });
    it('stream: true before empty messages', TEST, async () => {
      const err = await rejection(client.chat.completions.create({ ...BASE, messages: [], stream: true }));
      assertApiError(err, { param: 'stream', message: 'streaming is not supported' });
    });
    it('final role before max_tokens 0', TEST, async () => {
      const err = await rejection(client.chat.completions.create({
        ...BASE, max_tokens: 0, messages: [{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }],
      }));
      assertApiError(err, { param: 'messages', message: 'the final message must have role=user, found role=assistant' });
    });
    it('max_tokens 0 before the chat template', TEST, async () => {
      const err = await rejection(client.chat.completions.create({
        ...BASE, max_tokens: 0, messages: [{ role: 'user', content: 'a' }, { role: 'system', content: 's' }, { role: 'user', content: 'b' }],
      }));
      assertApiError(err, { param: 'max_tokens', message: 'max_tokens must be greater than zero' });
    });
  });

  describe('transport-level errors keep the envelope', () => {
    it('a body over 1 MiB is 413', TEST, async () => {
      const err = await rejection(client.chat.completions.create({
        ...BASE, messages: [{ role: 'user', content: 'x'.repeat(1100000) }],
      }));
      assertApiError(err, { status: 413, message: 'request body exceeds 1048576 bytes' });
    });
    it('a non-JSON content type is 415', TEST, async () => {
      const res = await fetch(`${server.baseURL}/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'text/plain' }, body: JSON.stringify(BASE),
      });
      const err = OpenAI.APIError.generate(res.status, await res.json(), undefined, res.headers);
      assertApiError(err, { status: 415, message: 'Content-Type must be application/json' });
    });
    it('invalid JSON is 400 with param null', TEST, async () => {
      const err = await rawError('{"model":');
      assertApiError(err, { message: /^parsing chat request: request body: not valid JSON/ });
    });
  });

  it('the server is still healthy and logged no 5xx', TEST, async () => {
    const c = await client.chat.completions.create(BASE);
    assert.equal(c.usage.completion_tokens, 1);
    const statuses = server.lines.filter((l) => /^(GET|POST) /.test(l)).map((l) => Number(l.split(' ')[2]));
    assert.ok(statuses.length > 50, `only ${statuses.length} request lines`);
    assert.deepEqual(statuses.filter((s) => s >= 500), []);
  });
});
