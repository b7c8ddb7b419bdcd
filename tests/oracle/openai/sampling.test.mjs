// OpenAI-client conformance of lily serve's default (openai) mode: sampling fields, seeds, stop strings, logprobs in the client's types, fields the client sends, refusals by name.
//
// Expected values come from outside lily where one exists: the transformers golden of the
// chess prompt (greedy tokens and the top-16 logits of every step, float64), HF tokenizers
// (token texts and ByteLevel bytes), the client's types and error classes, and docs/api.md's
// rules for what is accepted, ignored or refused.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  OpenAI, MODEL_ID, makeCheckpoint, startServer, hfTokenizer, loadGolden, rejection, byteLevelBytes, byteLevelToken,
} from './lib.mjs';

const CHESS = 'Name the two colors of a chessboard.';
const TEST = { timeout: 180000 };
const golden = loadGolden('tiny-seed1-chat');
const CHESS_32 = { model: MODEL_ID, messages: [{ role: 'user', content: CHESS }], max_tokens: 32 };
// Logprob gaps vs the float64 golden's logit gaps (log-softmax keeps differences): the CPU
// backend computes in float32 (docs/precision.md); measured here up to 3e-5 on this prompt.
const LOGIT_TOLERANCE = 1e-3;

const contentOf = (c) => c.choices[0].message.content;

describe('sampling, stop and logprobs through the OpenAI client (tiny seed-1 checkpoint)', () => {
  let ckpt;
  let server;
  let client;
  let tok;
  let banStops;
  let goldenText;

  before(async () => {
    ckpt = makeCheckpoint(1);
    tok = hfTokenizer(ckpt.dir);
    banStops = { [tok.tokenToId('<|endoftext|>')]: -100, [tok.tokenToId('<|im_end|>')]: -100 };
    goldenText = await tok.decode(golden.tokens);
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

  it('no sampling field, temperature 0, and temperature 0 with top_p all give the golden greedy answer', TEST, async () => {
    for (const fields of [{}, { temperature: 0 }, { temperature: 0, top_p: 0.9 }, { temperature: 0, seed: 5 }]) {
      const c = await client.chat.completions.create({ ...CHESS_32, ...fields });
      assert.equal(contentOf(c), goldenText, JSON.stringify(fields));
      assert.equal(c.usage.completion_tokens, 32);
    }
  });

  it('a seed reproduces a sampled answer, other seeds give other answers', TEST, async () => {
    const req = { ...CHESS_32, max_tokens: 16, temperature: 1, top_p: 0.95, logit_bias: banStops };
    const a = await client.chat.completions.create({ ...req, seed: 1234 });
    const b = await client.chat.completions.create({ ...req, seed: 1234 });
    assert.equal(contentOf(a), contentOf(b));
    const streamed = await client.chat.completions.create({ ...req, seed: 1234, stream: true });
    let text = '';
    for await (const chunk of streamed) text += chunk.choices[0]?.delta?.content ?? '';
    assert.equal(text, contentOf(a), 'the same seed streamed');
    const others = new Set();
    for (const seed of [1, 2, 3, 4]) others.add(contentOf(await client.chat.completions.create({ ...req, seed })));
    others.add(contentOf(a));
    assert.ok(others.size > 1, `four seeds, one answer: ${[...others]}`);
    assert.ok([...others].some((t) => !goldenText.startsWith(t)), 'temperature 1 is not the greedy answer');
  });

  it('frequency, presence and repetition penalties, top_k and min_p are accepted', TEST, async () => {
    const req = { ...CHESS_32, max_tokens: 24, temperature: 0, logit_bias: banStops };
    const penalised = { ...req, frequency_penalty: 2, presence_penalty: 2 };
    const p1 = await client.chat.completions.create(penalised);
    const p2 = await client.chat.completions.create(penalised);
    assert.equal(contentOf(p1), contentOf(p2), 'deterministic at temperature 0');
    assert.equal(p1.usage.completion_tokens, 24);
    for (const fields of [{ top_k: 20, min_p: 0.05, repetition_penalty: 1.1, temperature: 0.7, seed: 1 },
      { frequency_penalty: -2, presence_penalty: -2 }, { top_k: -1 }]) {
      const c = await client.chat.completions.create({ ...req, ...fields });
      assert.equal(c.usage.completion_tokens, 24, JSON.stringify(fields));
    }
    // A penalty changes a greedy answer that repeats itself: the golden answer repeats a token
    // (2808 and 863 come twice), so a strong presence penalty must change what follows.
    assert.ok(new Set(golden.tokens).size < golden.tokens.length, 'precondition: a token repeats');
    const strong = await client.chat.completions.create({ ...CHESS_32, temperature: 0, presence_penalty: 2, frequency_penalty: 2 });
    assert.notEqual(contentOf(strong), goldenText);
  });

  it('logit_bias forces a token and bans the greedy one', TEST, async () => {
    const ab = tok.tokenToId('ab');
    const forced = await client.chat.completions.create({ ...CHESS_32, max_tokens: 4, temperature: 0, logit_bias: { [ab]: 100 } });
    assert.equal(contentOf(forced), 'abababab');
    const banned = await client.chat.completions.create({ ...CHESS_32, max_tokens: 1, temperature: 0, logit_bias: { [golden.tokens[0]]: -100 } });
    assert.equal(contentOf(banned), await tok.decode([golden.steps[0][1][0]]), 'the second-best token of step 0');
  });

  describe('stop', () => {
    // A stop string from the golden answer: an ASCII stretch after the first token.
    let stop;
    let at;
    before(() => {
      const m = /[A-Za-z]{5,}/.exec(goldenText.slice(4));
      assert.ok(m, goldenText);
      stop = m[0].slice(1, 5);
      at = goldenText.indexOf(stop);
      assert.ok(at > 0);
    });
    for (const [name, make] of [['a string', (s) => s], ['an array', (s) => ['\u2603 never', s]]]) {
      it(`${name}: the answer ends right before the stop string, finish_reason stop (streamed too)`, TEST, async () => {
        const c = await client.chat.completions.create({ ...CHESS_32, stop: make(stop) });
        assert.equal(contentOf(c), goldenText.slice(0, at));
        assert.equal(c.choices[0].finish_reason, 'stop');
        assert.ok(c.usage.completion_tokens < 32);
        const stream = await client.chat.completions.create({ ...CHESS_32, stop: make(stop), stream: true });
        let text = '';
        let finish = null;
        for await (const chunk of stream) {
          text += chunk.choices[0]?.delta?.content ?? '';
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(text, goldenText.slice(0, at));
        assert.equal(finish, 'stop');
      });
    }
    it('a stop string that never occurs changes nothing', TEST, async () => {
      const c = await client.chat.completions.create({ ...CHESS_32, stop: ['\u2603', 'zzzzzz'] });
      assert.equal(contentOf(c), goldenText);
      assert.equal(c.choices[0].finish_reason, 'length');
    });
    it('an empty stop string and 17 stop strings are refused', TEST, async () => {
      let err = await rejection(client.chat.completions.create({ ...CHESS_32, stop: '' }));
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.param, 'stop');
      err = await rejection(client.chat.completions.create({ ...CHESS_32, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }));
      assert.deepEqual(err.error, { message: 'parsing chat request: stop has 17 strings, at most 16 allowed', type: 'invalid_request_error', param: 'stop', code: null });
    });
  });

  it('logprobs + top_logprobs: the client\'s types, the golden tokens and their top logits', TEST, async () => {
    const TOP = 5;
    const c = await client.chat.completions.create({ ...CHESS_32, logprobs: true, top_logprobs: TOP });
    assert.equal(contentOf(c), goldenText);
    const { logprobs } = c.choices[0];
    assert.deepEqual(Object.keys(logprobs), ['content', 'refusal']);
    assert.equal(logprobs.refusal, null);
    assert.equal(logprobs.content.length, 32);
    let worst = 0;
    logprobs.content.forEach((entry, i) => {
      assert.deepEqual(Object.keys(entry), ['token', 'logprob', 'bytes', 'top_logprobs']);
      const id = golden.tokens[i];
      // the token's bytes are its ByteLevel vocabulary entry's, its text their lossy decoding
      assert.deepEqual(entry.bytes, byteLevelBytes(tok.idToToken(id)), `step ${i}`);
      assert.equal(entry.token, Buffer.from(entry.bytes).toString('utf8'));
      assert.ok(entry.logprob <= 0, `logprob ${entry.logprob}`);
      assert.equal(entry.top_logprobs.length, TOP);
      const values = entry.top_logprobs.map((t) => t.logprob);
      assert.deepEqual(values, [...values].sort((x, y) => y - x), 'sorted, most likely first');
      // greedy: the chosen token is the top entry, with the same logprob
      assert.deepEqual(entry.top_logprobs[0], { token: entry.token, logprob: entry.logprob, bytes: entry.bytes });
      // the top ids and their gaps are the golden's top logits (log-softmax keeps differences)
      const ids = entry.top_logprobs.map((t) => tok.tokenToId(byteLevelToken(t.bytes)));
      const steps = golden.steps[i];
      const clear = steps[TOP - 1][1] - steps[TOP][1] > LOGIT_TOLERANCE;
      if (clear) assert.deepEqual(ids, steps.slice(0, TOP).map(([tid]) => tid), `step ${i}`);
      entry.top_logprobs.forEach((t, k) => {
        const gap = (entry.logprob - t.logprob) - (steps[0][1] - steps[k][1]);
        if (ids[k] === steps[k][0]) worst = Math.max(worst, Math.abs(gap));
      });
    });
    assert.ok(worst < LOGIT_TOLERANCE, `logprob gaps differ from the golden's logit gaps by up to ${worst}`);
    // top_logprobs 0 (and absent): empty lists; without logprobs: null
    const none = await client.chat.completions.create({ ...CHESS_32, max_tokens: 2, logprobs: true, top_logprobs: 0 });
    assert.deepEqual(none.choices[0].logprobs.content.map((e) => e.top_logprobs), [[], []]);
    const off = await client.chat.completions.create({ ...CHESS_32, max_tokens: 2 });
    assert.equal(off.choices[0].logprobs, null);
    const err = await rejection(client.chat.completions.create({ ...CHESS_32, logprobs: true, top_logprobs: 21 }));
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.param, 'top_logprobs');
  });

  it('the fields the client sends for its users (user, metadata, store) are accepted and logged as ignored', TEST, async () => {
    const from = server.lines.length;
    const c = await client.chat.completions.create({
      ...CHESS_32, user: 'user-1234', metadata: { session: 'abc' }, store: false, parallel_tool_calls: false,
    });
    assert.equal(contentOf(c), goldenText);
    const line = await server.waitForLine(/^POST \/v1\/chat\/completions 200 /, from);
    assert.match(line, / ignored="metadata,store,user"$/);  // parallel_tool_calls is used (issue 16)
    // Open WebUI's object-valued user, through the client's body override.
    const obj = await client.chat.completions.create(CHESS_32, { body: { ...CHESS_32, user: { id: 'u', name: 'n', role: 'user' } } });
    assert.equal(contentOf(obj), goldenText);
  });

  it('max_completion_tokens (the client\'s preferred name) limits the answer', TEST, async () => {
    const { max_tokens: _drop, ...noMax } = CHESS_32;
    const c = await client.chat.completions.create({ ...noMax, max_completion_tokens: 5 });
    assert.equal(c.usage.completion_tokens, 5);
    assert.equal(contentOf(c), await tok.decode(golden.tokens.slice(0, 5)));
    const err = await rejection(client.chat.completions.create({ ...CHESS_32, max_completion_tokens: 5 }));
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.deepEqual(err.error, {
      message: 'max_tokens (32) and max_completion_tokens (5) differ; send one of them', type: 'invalid_request_error', param: 'max_completion_tokens', code: null,
    });
  });

  it('features that would change the answer are refused by name (BadRequestError)', TEST, async () => {
    const cases = [
      [{ functions: [{ name: 'f', parameters: { type: 'object', properties: {} } }] }, 'functions', '"functions" is not supported yet'],
      [{ response_format: { type: 'json_object' } }, 'response_format', '"response_format" of type "json_object" is not supported yet'],
      [{ n: 2 }, 'n', 'n > 1 is not supported'],
      [{ messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url: 'https://example.com/x.png' } }] }] },
        'messages[0].content[1]', 'messages[0].content[1]: image inputs are not supported'],
    ];
    for (const [fields, param, message] of cases) {
      const err = await rejection(client.chat.completions.create({ ...CHESS_32, ...fields }));
      assert.ok(err instanceof OpenAI.BadRequestError, `${err.constructor.name}: ${err.message}`);
      assert.deepEqual(err.error, { message, type: 'invalid_request_error', param, code: null });
    }
  });
});
