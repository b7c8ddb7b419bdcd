// OpenAI-client conformance of thinking and tool calls (default openai mode): tool calls streamed and not, the client's runTools agent loop, tool_choice, reasoning fields, the reasoning budget, and a cache that survives thinking turns.
//
// A random-weight checkpoint never writes a tool call, so the answers that must be calls come
// from `lily serve --test-script` (test only: the matching request's output is forced token by
// token, and everything after the model, the output parser, streaming, ids, the session cache,
// is the production path). What is expected comes from outside lily: the official client's
// parsing, its ChatCompletionStream accumulator and its runTools loop (which call our
// functions and send their results back), HF tokenizers for token counts, and the rules of
// docs/output-parsing.md and docs/api.md written out by hand below.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL_ID, makeCheckpoint, startServer, hfTokenizer } from './lib.mjs';

const TEST = { timeout: 300000 };

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather of a city for some days',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' }, metric: { type: ['boolean', 'null'] } },
      required: ['city'],
    },
  },
};
const PING_TOOL = { type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {} } } };

const CALL_TEXT = 'I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
  + '<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>';
const TWO_CALLS = '<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>\n'
  + '<tool_call>\n<function=ping>\n</function>\n</tool_call>';
const THINK_TEXT = 'Two and two.\n</think>\n\nThe answer is 4.';
const THINK_CALL = 'The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n'
  + '</parameter>\n</function>\n</tool_call>';
const FINAL_ANSWER = 'It is sunny in Paris.';

const RULES = [
  { last_role: 'user', contains: 'weather in Paris', output: CALL_TEXT },
  { last_role: 'user', contains: 'Oslo and ping', output: TWO_CALLS },
  { last_role: 'user', contains: 'add two and two', output: THINK_TEXT },
  { last_role: 'user', contains: 'weather in Rome', output: THINK_CALL },
  { last_role: 'tool', contains: 'sunny', output: FINAL_ANSWER },
];

const CALL_ID = /^call_[A-Za-z0-9]{24}$/;

describe('thinking and tool calls through the openai client', () => {
  let checkpoint;
  let server;
  let client;
  let tok;
  let scriptDir;

  before(async () => {
    checkpoint = makeCheckpoint(1);
    tok = hfTokenizer(checkpoint.dir);
    scriptDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-script-'));
    const script = path.join(scriptDir, 'rules.json');
    fs.writeFileSync(script, JSON.stringify(RULES));
    server = await startServer(checkpoint.dir, ['--test-script', script]);
    client = server.client();
  });
  after(async () => {
    await server?.stop();
    checkpoint?.remove();
    if (scriptDir) fs.rmSync(scriptDir, { recursive: true, force: true });
  });

  it('a tool call, not streamed: content, tool_calls with converted arguments, finish_reason tool_calls', TEST, async () => {
    const c = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 200, tools: [WEATHER_TOOL],
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    });
    const choice = c.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.content, 'I will check.');
    assert.equal(choice.message.tool_calls.length, 1);
    const [call] = choice.message.tool_calls;
    assert.match(call.id, CALL_ID);
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    // By the schema: city a string, days an integer, metric (boolean or null) a boolean.
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3, metric: true });
    assert.ok(!('reasoning_content' in choice.message), 'thinking off: no reasoning_content key');
    assert.equal(c.usage.completion_tokens, (await tok.encode(CALL_TEXT + '<|im_end|>')).length);
  });

  it('the same call streamed: the client accumulates the same message; the first call delta carries id, type and name', TEST, async () => {
    const body = {
      model: MODEL_ID, max_tokens: 200, tools: [WEATHER_TOOL],
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    };
    const chunks = [];
    const stream = client.chat.completions.stream({ ...body, stream: true });
    stream.on('chunk', (chunk) => chunks.push(chunk));
    const final = await stream.finalChatCompletion();
    const message = final.choices[0].message;
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(message.content, 'I will check.');
    assert.equal(message.tool_calls.length, 1);
    assert.match(message.tool_calls[0].id, CALL_ID);
    assert.deepEqual(JSON.parse(message.tool_calls[0].function.arguments), { city: 'Paris', days: 3, metric: true });
    const callDeltas = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
    assert.ok(callDeltas.length >= 2, 'the header and at least one arguments fragment');
    assert.equal(callDeltas[0].index, 0);
    assert.match(callDeltas[0].id, CALL_ID);
    assert.equal(callDeltas[0].type, 'function');
    assert.equal(callDeltas[0].function.name, 'get_weather');
    for (const d of callDeltas.slice(1)) {
      assert.equal(d.id, undefined, 'later deltas carry no id');
      assert.equal(d.function.name, undefined, 'later deltas carry no name');
    }
    // Not valid JSON before the call is complete.
    const args = callDeltas.map((d) => d.function.arguments ?? '');
    for (let i = 1; i < args.length; i++) {
      assert.throws(() => JSON.parse(args.slice(0, i).join('')), SyntaxError);
    }
  });

  it('parallel calls get their own index and id; parallel_tool_calls false keeps the first', TEST, async () => {
    const body = {
      model: MODEL_ID, max_tokens: 200, tools: [WEATHER_TOOL, PING_TOOL],
      messages: [{ role: 'user', content: 'Weather in Oslo and ping please' }],
    };
    const c = await client.chat.completions.create(body);
    const calls = c.choices[0].message.tool_calls;
    assert.equal(c.choices[0].message.content, null, 'only calls: content null');
    assert.deepEqual(calls.map((x) => x.function.name), ['get_weather', 'ping']);
    assert.notEqual(calls[0].id, calls[1].id);
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Oslo' });
    assert.deepEqual(JSON.parse(calls[1].function.arguments), {});
    const streamed = await client.chat.completions.stream({ ...body, stream: true }).finalChatCompletion();
    assert.deepEqual(streamed.choices[0].message.tool_calls.map((x) => [x.function.name, JSON.parse(x.function.arguments)]),
      [['get_weather', { city: 'Oslo' }], ['ping', {}]]);
    const single = await client.chat.completions.create({ ...body, parallel_tool_calls: false });
    assert.deepEqual(single.choices[0].message.tool_calls.map((x) => x.function.name), ['get_weather']);
  });

  it('tool_choice none: the call markup stays text and no call is made', TEST, async () => {
    const c = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 200, tools: [WEATHER_TOOL], tool_choice: 'none',
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    });
    assert.equal(c.choices[0].finish_reason, 'stop');
    assert.equal(c.choices[0].message.tool_calls, undefined);
    assert.equal(c.choices[0].message.content, CALL_TEXT);
  });

  it('tool_choice none bans the call opening while decoding; auto does not', TEST, async () => {
    // A bias of +100 makes <tool_call> the model's choice at every step, unless it is banned.
    const body = {
      model: MODEL_ID, max_tokens: 4, temperature: 0, tools: [WEATHER_TOOL],
      logit_bias: { [tok.tokenToId('<tool_call>')]: 100 },
      messages: [{ role: 'user', content: 'Say anything.' }],
    };
    const auto = await client.chat.completions.create(body);
    assert.equal(auto.choices[0].message.content, '<tool_call>'.repeat(4), 'auto: the biased token wins');
    for (const extra of [{ tool_choice: 'none' }, { tool_choice: 'none', temperature: 0.8, seed: 3 }]) {
      const none = await client.chat.completions.create({ ...body, ...extra });
      assert.ok(!none.choices[0].message.content.includes('<tool_call>'), JSON.stringify(none.choices[0].message));
      assert.equal(none.choices[0].message.tool_calls, undefined);
    }
    // Without the request's own bias or sampling fields, none is the greedy decode but for the
    // ban (tool_choice does not change the prompt): the same answer as auto's greedy one.
    const { logit_bias: _drop, temperature: _t, ...plain } = body;
    const greedy = await client.chat.completions.create({ ...plain, max_tokens: 12 });
    const banned = await client.chat.completions.create({ ...plain, max_tokens: 12, tool_choice: 'none' });
    assert.equal(banned.choices[0].message.content, greedy.choices[0].message.content);
  });

  it('runTools: the client calls our function with the parsed arguments, sends the result, and gets the answer', TEST, async () => {
    const seen = [];
    const runner = client.chat.completions.runTools({
      model: MODEL_ID, max_tokens: 200,
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [{
        type: 'function',
        function: {
          name: 'get_weather',
          description: WEATHER_TOOL.function.description,
          parameters: WEATHER_TOOL.function.parameters,
          parse: JSON.parse,
          function: (args) => { seen.push(args); return `sunny, ${args.days} days`; },
        },
      }],
    });
    const answer = await runner.finalContent();
    assert.deepEqual(seen, [{ city: 'Paris', days: 3, metric: true }]);
    assert.equal(answer, FINAL_ANSWER);
    const messages = runner.messages;
    assert.equal(messages.at(-2).role, 'tool', 'the tool result was the last message of the second request');
  });

  it('tool_choice named and required force the call opening (seen in the raw text of a truncated answer)', TEST, async () => {
    const named = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 60, tools: [WEATHER_TOOL, PING_TOOL],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      messages: [{ role: 'user', content: 'Say anything.' }],
    });
    // The random-weight model does not close the call within 60 tokens: cut off, it is content.
    assert.equal(named.choices[0].finish_reason, 'length');
    assert.ok(named.choices[0].message.content.startsWith('<tool_call>\n<function=get_weather>\n'),
      JSON.stringify(named.choices[0].message.content));
    const required = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 40, tools: [WEATHER_TOOL], tool_choice: 'required',
      messages: [{ role: 'user', content: 'Say anything.' }],
    });
    assert.ok(required.choices[0].message.content.startsWith('<tool_call>\n<function='),
      JSON.stringify(required.choices[0].message.content));
    // Thinking on: after the reasoning. A budget of 2 closes it, then the opening follows.
    const thinking = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 80, tools: [WEATHER_TOOL],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      chat_template_kwargs: { enable_thinking: true }, reasoning_budget: 2, temperature: 0,
      messages: [{ role: 'user', content: 'Say anything.' }],
    });
    assert.ok(thinking.choices[0].message.content.startsWith('<tool_call>\n<function=get_weather>\n'),
      JSON.stringify(thinking.choices[0].message));
    const closeTokens = (await tok.encode('\n</think>')).length;
    assert.equal(thinking.usage.completion_tokens_details.reasoning_tokens, 2 + closeTokens);
  });

  it('thinking: reasoning_content and content, streamed and not, and reasoning_tokens', TEST, async () => {
    const body = {
      model: MODEL_ID, max_tokens: 100, chat_template_kwargs: { enable_thinking: true },
      messages: [{ role: 'user', content: 'Please add two and two.' }],
    };
    const c = await client.chat.completions.create(body);
    assert.equal(c.choices[0].message.reasoning_content, 'Two and two.');
    assert.equal(c.choices[0].message.content, 'The answer is 4.');
    assert.equal(c.choices[0].finish_reason, 'stop');
    assert.equal(c.usage.completion_tokens_details.reasoning_tokens, (await tok.encode('Two and two.\n</think>')).length);
    // reasoning_effort does the same; "none" turns it off again (no reasoning_content key).
    const effort = await client.chat.completions.create({ ...body, chat_template_kwargs: undefined, reasoning_effort: 'high' });
    assert.equal(effort.choices[0].message.reasoning_content, 'Two and two.');
    const off = await client.chat.completions.create({ ...body, chat_template_kwargs: undefined, reasoning_effort: 'none' });
    assert.ok(!('reasoning_content' in off.choices[0].message));
    assert.equal(off.choices[0].message.content, THINK_TEXT, 'thinking off: the text is content');
    // Streamed: every reasoning delta comes before the first content delta.
    const chunks = [];
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } })) {
      chunks.push(chunk);
    }
    const deltas = chunks.flatMap((x) => x.choices.map((ch) => ch.delta));
    const reasoning = deltas.map((d) => d.reasoning_content ?? '').join('');
    const content = deltas.map((d) => d.content ?? '').join('');
    assert.equal(reasoning, 'Two and two.');
    assert.equal(content, 'The answer is 4.');
    const lastReasoning = deltas.findLastIndex((d) => d.reasoning_content);
    const firstContent = deltas.findIndex((d) => d.content);
    assert.ok(lastReasoning < firstContent, 'reasoning first');
    assert.equal(chunks.at(-1).usage.completion_tokens_details.reasoning_tokens, c.usage.completion_tokens_details.reasoning_tokens);
  });

  it('an answer cut off inside the reasoning is all reasoning_content', TEST, async () => {
    const c = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 3, temperature: 0, chat_template_kwargs: { enable_thinking: true },
      messages: [{ role: 'user', content: 'Say anything.' }],
    });
    assert.equal(c.choices[0].finish_reason, 'length');
    assert.equal(c.choices[0].message.content, '');
    assert.ok(c.choices[0].message.reasoning_content.length > 0);
    assert.equal(c.usage.completion_tokens_details.reasoning_tokens, 3);
  });

  it('a call inside the reasoning turn: thinking on, the call after </think>', TEST, async () => {
    const c = await client.chat.completions.create({
      model: MODEL_ID, max_tokens: 200, tools: [WEATHER_TOOL], chat_template_kwargs: { enable_thinking: true },
      messages: [{ role: 'user', content: 'What is the weather in Rome?' }],
    });
    assert.equal(c.choices[0].message.reasoning_content, 'The user wants weather.');
    assert.equal(c.choices[0].message.tool_calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(c.choices[0].message.tool_calls[0].function.arguments), { city: 'Rome' });
    assert.equal(c.choices[0].finish_reason, 'tool_calls');
  });
});

// Six turns of an agent loop with thinking on (user, call, tool result, answer, ...), answered
// exactly as a fresh server answers them. With preserve_thinking the history is rendered as it
// was generated, and each turn reuses at least the previous prompt up to its generation prompt.
// With the template's default, a new user query drops the reasoning of every earlier assistant
// message, so the prompt diverges inside the previous turn's history (at its first assistant
// message after the previous query): a user turn can then reuse no more than the prompt of the
// previous user turn up to its generation prompt, which is what the snapshot there gives; the
// turns that follow a tool result keep the bound. (docs/server.md, "Session cache".)
describe('a six-turn agent loop with thinking on keeps its cache', () => {
  let checkpoint;
  let scriptDir;
  let script;

  before(() => {
    checkpoint = makeCheckpoint(1);
    scriptDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-script-'));
    script = path.join(scriptDir, 'rules.json');
    fs.writeFileSync(script, JSON.stringify([
      { last_role: 'user', contains: 'loop', output: THINK_CALL },
    ]));
  });
  after(() => {
    checkpoint?.remove();
    if (scriptDir) fs.rmSync(scriptDir, { recursive: true, force: true });
  });

  async function runLoop(kwargs) {
    const server = await startServer(checkpoint.dir, ['--test-script', script]);
    const client = server.client();
    const base = { model: MODEL_ID, tools: [WEATHER_TOOL], chat_template_kwargs: kwargs, temperature: 0 };
    const messages = [];
    const turns = [];
    try {
      for (let turn = 0; turn < 6; turn++) {
        if (turn % 2 === 0) messages.push({ role: 'user', content: `Turn ${turn}: loop, what is the weather in Rome?` });
        else messages.push({ role: 'tool', tool_call_id: turns.at(-1).message.tool_calls?.[0]?.id ?? 'x', content: `cloudy ${turn}` });
        const body = { ...base, max_tokens: turn % 2 === 0 ? 200 : 6, messages: structuredClone(messages) };
        const c = await client.chat.completions.create(body);
        turns.push({ body, message: c.choices[0].message, usage: c.usage, user: turn % 2 === 0 });
        const m = c.choices[0].message;
        // The client sends back what it got, as agents do (content, reasoning, calls).
        messages.push({ role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, ...(m.tool_calls ? { tool_calls: m.tool_calls } : {}) });
      }
    } finally {
      await server.stop();
    }
    // Each turn again on a fresh server (nothing cached): the same answer, token for token.
    for (let i = 1; i < turns.length; i++) {
      const fresh = await startServer(checkpoint.dir, ['--test-script', script]);
      try {
        const c = await fresh.client().chat.completions.create(turns[i].body);
        assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0);
        assert.equal(c.usage.completion_tokens, turns[i].usage.completion_tokens, `turn ${i}`);
        assert.equal(c.choices[0].message.content, turns[i].message.content, `turn ${i}`);
        assert.equal(c.choices[0].message.reasoning_content, turns[i].message.reasoning_content, `turn ${i}`);
      } finally {
        await fresh.stop();
      }
    }
    return turns;
  }

  it('preserve_thinking: every turn reuses the previous prompt up to its generation prompt', TEST, async () => {
    const tok = hfTokenizer(checkpoint.dir);
    const generationPrompt = (await tok.encode('<|im_start|>assistant\n<think>\n')).length;
    const turns = await runLoop({ enable_thinking: true, preserve_thinking: true });
    for (let i = 1; i < turns.length; i++) {
      const bound = turns[i - 1].usage.prompt_tokens - generationPrompt;
      assert.ok(turns[i].usage.prompt_tokens_details.cached_tokens >= bound,
        `turn ${i}: cached ${turns[i].usage.prompt_tokens_details.cached_tokens} < ${bound}`);
    }
  });

  it('the template default: tool turns reuse the previous prompt, user turns the previous user turn\'s', TEST, async () => {
    const tok = hfTokenizer(checkpoint.dir);
    const generationPrompt = (await tok.encode('<|im_start|>assistant\n<think>\n')).length;
    const turns = await runLoop({ enable_thinking: true });
    for (let i = 1; i < turns.length; i++) {
      const previous = turns[i].user ? turns[i - 2] : turns[i - 1];
      const bound = previous.usage.prompt_tokens - generationPrompt;
      assert.ok(turns[i].usage.prompt_tokens_details.cached_tokens >= bound,
        `turn ${i}: cached ${turns[i].usage.prompt_tokens_details.cached_tokens} < ${bound}`);
    }
  });
});
