// OpenAI-client conformance of lily serve's transport (on --strict; common to both API modes): a completion whose headers and body arrive as two TCP writes (as the client's fetch sends them) is answered at once, every time.
//
// Regression test for a bug these tests found (fixed in src/server/http_server.cpp): the
// disconnect watch armed while the engine works peeked with a *blocking* recv(MSG_PEEK).
// Asio's edge-triggered reactor can complete async_wait(wait_read) for bytes the body read has
// already consumed; the peek then blocked the connection's strand (and an I/O thread) until
// the client sent more or closed, so the finished response was not written (log: "200
// 15006ms ... tok/s=4.7"). About 1 request in 60 with the head and body in two writes; the
// watch now peeks with MSG_DONTWAIT and re-arms on EAGAIN.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { MODEL_ID, makeCheckpoint, startServer } from './lib.mjs';

const ROUNDS = 150;
const ANSWER_WITHIN_MS = 4000; // a 1-token completion takes about 0.2 s here
const GIVE_UP_AFTER = 3; // stuck requests before the loop stops (bounds the run time)

// One request on a fresh connection: the head in one write, the body in a second one
// (Nagle off, so they leave as separate segments). Resolves with the ms to the full response,
// or null when none came within ANSWER_WITHIN_MS.
function twoWriteRequest(port, body) {
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`;
  return new Promise((resolve) => {
    const t0 = Date.now();
    let got = '';
    const sock = net.connect(port, '127.0.0.1', () => {
      sock.setNoDelay(true);
      sock.write(head);
      sock.write(body);
    });
    const timer = setTimeout(() => { sock.destroy(); resolve(null); }, ANSWER_WITHIN_MS);
    sock.on('data', (d) => {
      got += d;
      const split = got.indexOf('\r\n\r\n');
      const length = /content-length: *(\d+)/i.exec(got.slice(0, split));
      if (split >= 0 && length && Buffer.byteLength(got.slice(split + 4)) >= Number(length[1])) {
        clearTimeout(timer);
        sock.destroy();
        assert.match(got, /^HTTP\/1\.1 200 /);
        resolve(Date.now() - t0);
      }
    });
    sock.on('error', () => {});
  });
}

describe('transport: responses are written as soon as they are ready', () => {
  let ckpt;
  let server;

  before(async () => {
    ckpt = makeCheckpoint(1);
    server = await startServer(ckpt.dir, [], { strict: true });
  });
  after(async () => {
    if (server) {
      const exit = await server.stop();
      assert.deepEqual(exit, { code: 0, signal: null }, server.lines.join('\n'));
    }
    ckpt?.remove();
  });

  it(`${ROUNDS} completions sent as header + body writes are each answered within ${ANSWER_WITHIN_MS} ms`, { timeout: 300000 }, async () => {
    const body = JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1 });
    const stuck = [];
    let done = 0;
    for (; done < ROUNDS && stuck.length < GIVE_UP_AFTER; done++) {
      const ms = await twoWriteRequest(server.port, body);
      if (ms === null) stuck.push(done);
    }
    // The server's own log line for a stuck request shows when it finally wrote the answer.
    const late = server.lines.filter((l) => /^POST \/v1\/chat\/completions 200 \d{4,}ms/.test(l));
    assert.deepEqual(stuck, [],
      `${stuck.length} of ${done} requests got no response within ${ANSWER_WITHIN_MS} ms ` +
      `(see the KNOWN SERVER BUG note at the top of this file); late log lines:\n${late.join('\n')}`);
  });
});
