// `longctx serve` through the official `openai` npm client: chat and legacy completions, streamed
// and not, models, errors, and 4 concurrent streams that each get what they get alone.
//
//   node openai.test.mjs LONGCTX_BINARY [MODEL.gguf]
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, importDependency } from './lib/serve.mjs';

const { default: OpenAI } = await importDependency('openai');

let server;
let client;
let model;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120_000 });
});

after(async () => {
  if (server) await server.stop();
});

const getModel = async () => {
  if (!model) {
    const list = await client.models.list();
    model = list.data[0]?.id ?? 'longctx';
  }
  return model;
};

const chatRequest = async (content, extra = {}) => ({
  model: await getModel(),
  messages: [{ role: 'user', content }],
  temperature: 0,
  max_tokens: 16,
  ...extra,
});

const completionRequest = async (prompt, extra = {}) => ({
  model: await getModel(),
  prompt,
  temperature: 0,
  max_tokens: 16,
  ...extra,
});

// Streams a chat completion; returns the concatenated content and checks each chunk's shape.
const streamChat = async (req) => {
  const stream = await client.chat.completions.create({ ...req, stream: true });
  let text = '';
  let id = null;
  let finish = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.equal(typeof chunk.id, 'string');
    if (id === null) id = chunk.id;
    assert.equal(chunk.id, id, 'every chunk of a stream has the same id');
    const c = chunk.choices?.[0];
    if (!c) continue;               // a usage-only chunk
    if (c.delta?.role !== undefined) assert.equal(c.delta.role, 'assistant');
    if (typeof c.delta?.content === 'string') text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(chunks > 0, 'the stream carried chunks');
  assert.ok(['stop', 'length'].includes(finish), `a chunk carries finish_reason stop|length, got ${finish}`);
  return text;
};

const streamCompletion = async (req) => {
  const stream = await client.completions.create({ ...req, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    const c = chunk.choices?.[0];
    if (!c) continue;
    if (typeof c.text === 'string') text += c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(['stop', 'length'].includes(finish), `a chunk carries finish_reason stop|length, got ${finish}`);
  return text;
};

const checkUsage = (usage, maxTokens, finish) => {
  assert.ok(usage, 'usage is present');
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0, 'usage.prompt_tokens > 0');
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 0);
  assert.ok(usage.completion_tokens <= maxTokens, 'completion_tokens <= max_tokens');
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, 'total = prompt + completion');
  if (finish === 'length') assert.equal(usage.completion_tokens, maxTokens, 'length means max_tokens were made');
};

test('models.list returns at least one model', async () => {
  const list = await client.models.list();
  assert.ok(Array.isArray(list.data) && list.data.length >= 1, 'at least one model');
  for (const m of list.data) {
    assert.equal(typeof m.id, 'string');
    assert.ok(m.id.length > 0);
    assert.equal(m.object, 'model');
  }
});

test('chat completion, not streamed: the response shape', async () => {
  const r = await client.chat.completions.create(await chatRequest('Once upon a time, there was'));
  assert.equal(typeof r.id, 'string');
  assert.ok(r.id.length > 0);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.created, 'number');
  assert.equal(typeof r.model, 'string');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  checkUsage(r.usage, 16, c.finish_reason);
});

test('chat completion, streamed, equals the same request not streamed', async () => {
  const req = await chatRequest('The old lighthouse keeper said');
  const whole = await client.chat.completions.create(req);
  const streamed = await streamChat(req);
  assert.equal(streamed, whole.choices[0].message.content);
});

test('legacy completion, not streamed and streamed, agree', async () => {
  const req = await completionRequest('Once upon a time');
  const r = await client.completions.create(req);
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.id, 'string');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), `finish_reason ${r.choices[0].finish_reason}`);
  checkUsage(r.usage, 16, r.choices[0].finish_reason);
  const streamed = await streamCompletion(req);
  assert.equal(streamed, r.choices[0].text);
});

test('an unknown attention method is a 400 that names it', async () => {
  const req = await chatRequest('Hello', { longctx: { attn: 'nosuchmethod' } });
  await assert.rejects(client.chat.completions.create(req), (err) => {
    assert.ok(err instanceof OpenAI.APIError, `an APIError, got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.status, 400);
    assert.match(err.message, /nosuchmethod/);
    return true;
  });
});

test('max_tokens: -1 is a 400', async () => {
  const req = await chatRequest('Hello', { max_tokens: -1 });
  await assert.rejects(client.chat.completions.create(req), (err) => {
    assert.ok(err instanceof OpenAI.APIError, `an APIError, got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.status, 400);
    return true;
  });
});

test('4 concurrent streams each equal the same request alone', async () => {
  const prompts = [
    'Once upon a time, there was a little girl named',
    'The capital of the country was a city of',
    'In the morning the fisherman went down to',
    'The essay begins with a question about',
  ];
  const reqs = await Promise.all(prompts.map((p) => chatRequest(p, { max_tokens: 32 })));
  const alone = [];
  for (const r of reqs) alone.push(await streamChat(r));
  const together = await Promise.all(reqs.map((r) => streamChat(r)));
  for (let i = 0; i < reqs.length; i++) {
    assert.equal(together[i], alone[i], `prompt ${i} (${JSON.stringify(prompts[i])}) concurrent vs alone`);
  }
});

test('logit_bias through the client: +100 on one token makes it every token; false bans the greedy one', async () => {
  const tk = await fetch(server.url + '/tokenize', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ content: 'Once upon a time', with_pieces: true }),
  });
  assert.equal(tk.status, 200);
  const { tokens } = await tk.json();
  const { id, piece } = tokens[tokens.length - 1];
  const forced = await client.completions.create(
    await completionRequest('The old lighthouse keeper said', { max_tokens: 4, temperature: 1, seed: 9, logit_bias: { [id]: 100 } }));
  assert.equal(forced.choices[0].text, piece.repeat(4));
  // Banning the greedy first token: the first token changes.
  const greedy = await client.completions.create(await completionRequest('Once upon a time', { max_tokens: 1 }));
  const first = await fetch(server.url + '/tokenize', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ content: 'Once upon a time' + greedy.choices[0].text, with_pieces: true }),
  });
  const all = (await first.json()).tokens;
  const greedyId = all[all.length - 1].id;
  assert.equal(all[all.length - 1].piece, greedy.choices[0].text, 'the greedy token is the text\'s last token');
  const banned = await client.completions.create(
    await completionRequest('Once upon a time', { max_tokens: 1, logit_bias: { [greedyId]: false } }));
  assert.notEqual(banned.choices[0].text, greedy.choices[0].text);
  await assert.rejects(
    client.completions.create(await completionRequest('Once', { logit_bias: { 99999999: 1 } })),
    (err) => err instanceof OpenAI.APIError && err.status === 400 && /vocabulary/.test(err.message));
});
