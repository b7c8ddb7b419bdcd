// OpenAI-client conformance of lily serve --api-key (on --strict; common to both API modes): the right key works, a wrong or missing one is 401 (AuthenticationError).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { OpenAI, MODEL_ID, makeCheckpoint, startServer, rejection } from './lib.mjs';

const KEY = 'secret';
const TEST = { timeout: 60000 };
const REQUEST = { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi there.' }], max_tokens: 2 };
const AUTH_ERROR = {
  message: 'missing or invalid API key (send Authorization: Bearer <key>)',
  type: 'invalid_request_error',
  param: null,
  code: 'invalid_api_key',
};

function assertAuthError(err) {
  assert.ok(err instanceof OpenAI.AuthenticationError, `expected AuthenticationError, got ${err.constructor.name}: ${err.message}`);
  assert.equal(err.status, 401);
  assert.deepEqual(err.error, AUTH_ERROR);
  assert.equal(err.code, 'invalid_api_key');
  assert.equal(err.type, 'invalid_request_error');
  assert.equal(err.param, null);
}

describe('a server started with --api-key', () => {
  let ckpt;
  let server;

  before(async () => {
    ckpt = makeCheckpoint(1);
    server = await startServer(ckpt.dir, ['--api-key', KEY], { strict: true });
  });
  after(async () => {
    if (server) {
      const exit = await server.stop();
      assert.deepEqual(exit, { code: 0, signal: null }, server.lines.join('\n'));
    }
    ckpt?.remove();
  });

  it('serves the client that sends the key', TEST, async () => {
    const client = server.client({ apiKey: KEY });
    const c = await client.chat.completions.create(REQUEST);
    assert.equal(c.object, 'chat.completion');
    assert.equal(c.usage.completion_tokens, 2);
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), [MODEL_ID]);
  });

  for (const apiKey of ['wrong', 'secre', 'Secret', 'secretsecret']) {
    it(`refuses the key ${JSON.stringify(apiKey)} with 401 on every endpoint`, TEST, async () => {
      const client = server.client({ apiKey });
      assertAuthError(await rejection(client.chat.completions.create(REQUEST)));
      assertAuthError(await rejection(client.models.list()));
    });
  }

  it('refuses a request without an Authorization header, and a non-Bearer scheme', TEST, async () => {
    for (const headers of [{}, { authorization: `Basic ${KEY}` }, { authorization: KEY }]) {
      const res = await fetch(`${server.baseURL}/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(REQUEST),
      });
      assert.equal(res.status, 401, JSON.stringify(headers));
      assert.deepEqual(await res.json(), { error: AUTH_ERROR });
    }
  });

  it('checks the key before validating the body', TEST, async () => {
    const client = server.client({ apiKey: 'wrong' });
    assertAuthError(await rejection(client.chat.completions.create({ ...REQUEST, model: 'gpt-4o', temperature: 1 })));
  });

  it('leaves /health open', TEST, async () => {
    const res = await fetch(`http://127.0.0.1:${server.port}/health`);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { status: 'ok' });
  });
});
