// OpenAI-client conformance of lily serve's session prefix cache (on --strict; common to both API modes): usage.prompt_tokens_details.cached_tokens, prompt_cache_key steering, LRU eviction.
//
// The expected cached_tokens come from Lily's rules (docs/session-cache.md), not from the server:
//   * an entry holds the prompt plus the generated tokens that were fed back: all of them
//     after a stop token (the stop token included), all but the last after the length
//     limit, none when max_tokens is 1 ("Which generated tokens are in the state");
//   * a request reuses the entry whose tokens are a STRICT prefix of its prompt (an equal
//     entry is no hit), preferring a prompt_cache_key match, then length; a hit takes the
//     entry out of the cache; a miss with both slots used evicts the least recently used.
// Token sequences are the HF tokenizer's encoding of lib.mjs renderChat's rendering,
// generated ids come from the transformers golden, and every prompt_tokens the server
// reports is checked against the same encoding.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL_ID, makeCheckpoint, startServer, hfTokenizer, loadGolden, promptIds, isStrictPrefix } from './lib.mjs';

const CHESS = 'Name the two colors of a chessboard.';
const TEST = { timeout: 180000 };

let ckpt;
let tok;
const golden = loadGolden('tiny-seed1-chat');
const servers = new Set();

before(() => {
  ckpt = makeCheckpoint(1);
  tok = hfTokenizer(ckpt.dir);
});
after(async () => {
  for (const s of servers) await s.stop();
  ckpt?.remove();
});

// A fresh server for one scenario (a fresh, empty cache); always stopped, and also by the
// file's after hook if anything escapes.
async function withServer(fn) {
  const server = await startServer(ckpt.dir, [], { strict: true });
  servers.add(server);
  try {
    return await fn(server.client(), server);
  } finally {
    const exit = await server.stop();
    servers.delete(server);
    assert.deepEqual(exit, { code: 0, signal: null }, server.lines.join('\n'));
  }
}

async function ask(client, messages, maxTokens, key) {
  const body = { model: MODEL_ID, messages, max_tokens: maxTokens };
  if (key !== undefined) body.prompt_cache_key = key;
  const c = await client.chat.completions.create(body);
  // prompt_tokens is the HF tokenizer's count of the rendered conversation
  assert.equal(c.usage.prompt_tokens, (await promptIds(tok, messages)).length, `prompt_tokens of ${JSON.stringify(messages)}`);
  return c;
}
const cached = (c) => c.usage.prompt_tokens_details.cached_tokens;

describe('a conversation continued turn by turn', () => {
  it('turn 2 reuses turn 1\'s prompt and fed tokens (length limit: all but the last generated token)', TEST, async () => {
    await withServer(async (client) => {
      const turn1 = [{ role: 'user', content: CHESS }];
      const r1 = await ask(client, turn1, 2);
      assert.equal(cached(r1), 0);
      assert.equal(r1.choices[0].finish_reason, 'length');
      assert.equal(r1.choices[0].message.content, await tok.decode(golden.tokens.slice(0, 2)), 'greedy = golden');
      const P1 = r1.usage.prompt_tokens;
      const C1 = r1.usage.completion_tokens;
      assert.equal(P1, golden.prompt_ids.length);
      assert.equal(C1, 2);

      // The same turn-1 request again: the cached entry (prompt + 1 fed token) is longer than
      // this prompt, so it is no prefix; an exact repeat never hits through that path.
      const again = await ask(client, turn1, 2);
      assert.equal(cached(again), 0, 'exact repeat of turn 1');
      assert.ok(cached(again) < again.usage.prompt_tokens);
      assert.equal(again.choices[0].message.content, r1.choices[0].message.content);

      const turn2 = [...turn1, { role: 'assistant', content: r1.choices[0].message.content },
        { role: 'user', content: 'And what are the pieces called?' }];
      const entry = golden.prompt_ids.concat(golden.tokens.slice(0, C1 - 1)); // last id unfed
      const t2 = await promptIds(tok, turn2);
      assert.ok(isStrictPrefix(entry, t2),
        'precondition (HF tokenizer): turn 2 re-tokenises turn 1 + its answer to the same ids');
      const r2 = await ask(client, turn2, 4);
      assert.equal(cached(r2), P1 + C1 - 1);
      assert.equal(cached(r2), entry.length);
      assert.equal(r2.usage.total_tokens, r2.usage.prompt_tokens + r2.usage.completion_tokens);
    });
  });

  // A turn that ends on a stop token. The synthetic tiny model practically never emits
  // <|im_end|> (none in ~12,000 greedy steps over 4,000 prompts) but sometimes <|endoftext|>;
  // STOP_QUESTION is one of the user messages found that way (by sending "Question N" with
  // max_tokens 4 to a seed-1 server) whose answer re-tokenises to the same ids. If the
  // checkpoint generator (src/synth) changes, the precondition below fails: search again.
  const STOP_QUESTION = 'Question 3973';
  const ENDOFTEXT = '<|endoftext|>';

  async function stoppedTurn(client) {
    const turn1 = [{ role: 'user', content: STOP_QUESTION }];
    const r1 = await ask(client, turn1, 4);
    assert.equal(cached(r1), 0);
    assert.equal(r1.choices[0].finish_reason, 'stop', `precondition: "${STOP_QUESTION}" stops within 4 tokens on seed 1`);
    const content = r1.choices[0].message.content;
    // completion_tokens counts the stop token, which the content does not show
    assert.equal((await tok.encode(content)).length, r1.usage.completion_tokens - 1,
      'precondition (HF tokenizer): the shown answer re-encodes to completion_tokens - 1 ids');
    return { turn1, r1, content };
  }

  it('after a stop, turn 2 reuses the prompt and every generated token, the stop token included', TEST, async () => {
    await withServer(async (client) => {
      const { turn1, r1, content } = await stoppedTurn(client);
      // The entry is prompt + all C1 generated ids (the stop token was fed). Its last id is
      // <|endoftext|>, so a turn 2 that writes it back (special-token text in a content is
      // that token, as HF tokenizers and the chat template treat it) extends it exactly.
      const turn2 = [...turn1, { role: 'assistant', content: content + ENDOFTEXT }, { role: 'user', content: 'Go on.' }];
      const t1 = await promptIds(tok, turn1);
      const t2 = await promptIds(tok, turn2);
      const endoftext = (await tok.encode(ENDOFTEXT))[0];
      assert.deepEqual(t2.slice(0, t1.length), t1);
      assert.equal(t2[r1.usage.prompt_tokens + r1.usage.completion_tokens - 1], endoftext);
      const r2 = await ask(client, turn2, 2);
      assert.equal(cached(r2), r1.usage.prompt_tokens + r1.usage.completion_tokens);
    });
  });

  it('after a stop on <|endoftext|>, the plainly re-rendered turn 2 is no hit', TEST, async () => {
    await withServer(async (client) => {
      const { turn1, content } = await stoppedTurn(client);
      // The template closes the assistant turn with <|im_end|>, not the <|endoftext|> that was
      // fed: the entry is no token prefix, and a fresh server has no other entry.
      const turn2 = [...turn1, { role: 'assistant', content }, { role: 'user', content: 'Go on.' }];
      const r2 = await ask(client, turn2, 2);
      assert.equal(cached(r2), 0);
    });
  });

  it('a request whose prompt equals a cached entry exactly is no hit; its extension is', TEST, async () => {
    await withServer(async (client) => {
      const turn1 = [{ role: 'user', content: CHESS }];
      // max_tokens 1: nothing generated is fed back, so the entry is exactly the prompt
      const r1 = await ask(client, turn1, 1);
      assert.equal(cached(r1), 0);
      const P1 = r1.usage.prompt_tokens;
      const r2 = await ask(client, turn1, 1);
      assert.equal(cached(r2), 0, 'an entry equal to the whole prompt is not a strict prefix');
      const turn2 = [...turn1, { role: 'assistant', content: r1.choices[0].message.content },
        { role: 'user', content: 'Why?' }];
      assert.ok(isStrictPrefix(golden.prompt_ids, await promptIds(tok, turn2)));
      const r3 = await ask(client, turn2, 1);
      assert.equal(cached(r3), P1, 'P1 + C1 - 1 with C1 = 1');
    });
  });

  it('a hit takes the entry: of two branches from one turn only the first reuses it', TEST, async () => {
    await withServer(async (client) => {
      const turn1 = [{ role: 'user', content: 'Pick a number.' }];
      const r1 = await ask(client, turn1, 1);
      const branch = (answer, next) => [...turn1, { role: 'assistant', content: answer }, { role: 'user', content: next }];
      const b1 = await ask(client, branch('Seven.', 'Why seven?'), 1);
      assert.equal(cached(b1), r1.usage.prompt_tokens);
      const b2 = await ask(client, branch('Three.', 'Why three?'), 1);
      assert.equal(cached(b2), 0, 'the turn-1 entry now holds branch 1, which is no prefix of branch 2');
    });
  });

  it('a cache hit and a cold start give the same answer', TEST, async () => {
    const turn1 = [{ role: 'user', content: CHESS }];
    const turn2 = [...turn1, { role: 'assistant', content: await tok.decode(golden.tokens.slice(0, 2)) },
      { role: 'user', content: 'And what are the pieces called?' }];
    const warm = await withServer(async (client) => {
      await ask(client, turn1, 2);
      const r = await ask(client, turn2, 12);
      assert.ok(cached(r) > 0, 'warm: turn 2 reuses turn 1');
      return r;
    });
    const cold = await withServer(async (client) => {
      const r = await ask(client, turn2, 12);
      assert.equal(cached(r), 0, 'cold: a fresh server has nothing cached');
      return r;
    });
    assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
    assert.equal(warm.choices[0].finish_reason, cold.choices[0].finish_reason);
    assert.equal(warm.usage.completion_tokens, cold.usage.completion_tokens);
    assert.equal(warm.usage.prompt_tokens, cold.usage.prompt_tokens);
  });
});

describe('prompt_cache_key steers between token-prefix candidates', () => {
  // A is a prefix conversation of B, B of C; D branches from A. Sending B first and A second
  // leaves two entries (each exactly its prompt, max_tokens 1) that are both strict
  // prefixes of C, of different lengths. Sent the other way round, B would consume A's entry.
  const SYSTEM = { role: 'system', content: 'You are a terse assistant.' };
  const A = [SYSTEM, { role: 'user', content: 'Pick a color.' }];
  const B = [...A, { role: 'assistant', content: 'Blue.' }, { role: 'user', content: 'Why that one?' }];
  const C = [...B, { role: 'assistant', content: 'It is calm.' }, { role: 'user', content: 'Name another.' }];
  const D = [...A, { role: 'assistant', content: 'Red.' }, { role: 'user', content: 'Why that one?' }];
  let tA;
  let tB;
  const answers = [];

  before(async () => {
    tA = await promptIds(tok, A);
    tB = await promptIds(tok, B);
    const tC = await promptIds(tok, C);
    const tD = await promptIds(tok, D);
    assert.ok(isStrictPrefix(tA, tB) && isStrictPrefix(tB, tC) && isStrictPrefix(tA, tD) && !isStrictPrefix(tB, tD),
      'precondition (HF tokenizer): A < B < C and A < D as token sequences');
  });

  async function scenario(last, key) {
    return withServer(async (client) => {
      const rb = await ask(client, B, 1, 'conv-b');
      const ra = await ask(client, A, 1, 'conv-a');
      assert.equal(cached(rb), 0);
      assert.equal(cached(ra), 0, 'B\'s entry is longer than A: no prefix');
      return ask(client, last, 3, key);
    });
  }

  it('the key of the shorter entry beats length', TEST, async () => {
    const r = await scenario(C, 'conv-a');
    assert.equal(cached(r), tA.length);
    answers.push(r.choices[0].message.content);
  });
  it('the key of the longer entry picks it', TEST, async () => {
    const r = await scenario(C, 'conv-b');
    assert.equal(cached(r), tB.length);
    answers.push(r.choices[0].message.content);
  });
  it('without a key the longest prefix wins', TEST, async () => {
    const r = await scenario(C);
    assert.equal(cached(r), tB.length);
    answers.push(r.choices[0].message.content);
  });
  it('a null key is no key', TEST, async () => {
    const r = await scenario(C, null);
    assert.equal(cached(r), tB.length);
  });
  it('a key that matches no entry falls back to the longest prefix', TEST, async () => {
    const r = await scenario(C, 'conv-x');
    assert.equal(cached(r), tB.length);
  });
  it('a key never bypasses token equality', TEST, async () => {
    // D diverges from B after A; the entry keyed conv-b is not a prefix of D.
    const r = await scenario(D, 'conv-b');
    assert.equal(cached(r), tA.length);
  });
  it('whichever entry is reused, the answer is the same', () => {
    assert.equal(answers.length, 3, 'the three tests above ran');
    assert.equal(new Set(answers).size, 1, JSON.stringify(answers));
  });
});

describe('two entries, least recently used evicted', () => {
  const conv = (name, turns) => {
    const out = [{ role: 'user', content: `${name} 1.` }];
    for (let i = 2; i <= turns; i++) out.push({ role: 'assistant', content: 'Ok.' }, { role: 'user', content: `${name} ${i}.` });
    return out;
  };
  it('a third conversation evicts the entry used least recently, not the oldest one', TEST, async () => {
    await withServer(async (client) => {
      const len = async (m) => (await promptIds(tok, m)).length;
      for (const name of ['Alpha', 'Beta', 'Gamma']) {
        for (let i = 1; i < 4; i++) {
          assert.ok(isStrictPrefix(await promptIds(tok, conv(name, i)), await promptIds(tok, conv(name, i + 1))),
            `precondition (HF tokenizer): ${name} ${i} < ${name} ${i + 1}`);
        }
      }
      // [request, expected cached_tokens]; every request max_tokens 1 (entry = its prompt)
      const steps = [
        [conv('Alpha', 1), 0],                          // entries: X1
        [conv('Beta', 1), 0],                           // X1, Y1
        [conv('Alpha', 2), await len(conv('Alpha', 1))], // hit X1 -> X2 (most recent); Y1 is now LRU
        [conv('Gamma', 1), 0],                          // miss: evicts Y1 -> X2, Z1
        [conv('Alpha', 3), await len(conv('Alpha', 2))], // X survived -> Z1, X3
        [conv('Beta', 2), 0],                           // Y was evicted; evicts Z1 -> X3, Y2
        [conv('Alpha', 4), await len(conv('Alpha', 3))], // -> Y2, X4
        [conv('Gamma', 2), 0],                          // Z was evicted; evicts Y2 -> X4, Z2
        [conv('Beta', 3), 0],                           // Y2 was evicted; evicts X4 -> Z2, Y3
        [conv('Gamma', 3), await len(conv('Gamma', 2))], // Z2 still there
      ];
      const got = [];
      for (const [messages] of steps) got.push(cached(await ask(client, messages, 1)));
      assert.deepEqual(got, steps.map(([, want]) => want));
    });
  });
});
