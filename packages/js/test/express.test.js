// The Express middleware beyond the shared HTTP scenarios
// (http-conformance.test.js): bodies and body parsers, what is stored of a
// response, the limits, a completion the store refuses, a route that never
// answers.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import express from 'express';
import { Guard, MemoryStore } from '../index.js';
import { idempotency, idempotencyKey, keepRawBody, scopedKey } from '../express.js';

async function serve(app, body) {
  const server = createServer(app);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    return await body(`http://127.0.0.1:${server.address().port}`);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}

const post = (url, key, body, headers = {}) =>
  fetch(url, { method: 'POST', headers: { 'idempotency-key': key, ...headers }, body });

function app(options, ...route) {
  const a = express();
  a.set('env', 'test');
  for (const mw of route.slice(0, -1)) a.use(mw);
  a.use(idempotency(options));
  a.post('/orders', route.at(-1));
  return a;
}

test('the route gets the parsed JSON body and the raw bytes; the fingerprint is of the raw bytes', async () => {
  const guard = Guard.load();
  const seen = [];
  const a = app({ guard }, (req, res) => {
    seen.push([req.body, req.rawBody.toString(), req.idempotency.key, typeof req.idempotency.fence]);
    res.status(201).json({ ok: true });
  });
  await serve(a, async (url) => {
    const json = { 'content-type': 'application/json' };
    assert.equal((await post(`${url}/orders`, 'k', '{"a": 1}', json)).status, 201);
    // The same JSON value in other bytes is another request.
    assert.equal((await post(`${url}/orders`, 'k', '{"a":1}', json)).status, 422);
    assert.equal((await post(`${url}/orders`, 'k2', '{bad', json)).status, 400);
  });
  assert.deepEqual(seen, [[{ a: 1 }, '{"a": 1}', 'k', 'bigint']]);
});

test('a body parser mounted before keeps the raw bytes with keepRawBody; without them the request fails', async () => {
  const guard = Guard.load();
  let runs = 0;
  const route = (req, res) => {
    runs += 1;
    res.status(201).json(req.body);
  };
  await serve(app({ guard }, express.json({ verify: keepRawBody }), route), async (url) => {
    const first = await post(`${url}/orders`, 'k', '{"a":1}', { 'content-type': 'application/json' });
    const again = await post(`${url}/orders`, 'k', '{"a":1}', { 'content-type': 'application/json' });
    assert.deepEqual([first.status, await first.json(), again.headers.get('idempotent-replayed'), runs], [201, { a: 1 }, 'true', 1]);
  });
  await serve(app({ guard }, express.json(), route), async (url) => {
    const refused = await post(`${url}/orders`, 'k3', '{"a":1}', { 'content-type': 'application/json' });
    assert.equal(refused.status, 500);
    assert.equal(runs, 1, 'the route never ran');
  });
});

test('streamed writes, writeHead and repeated headers are stored and replayed; hop-by-hop headers are not', async () => {
  const guard = Guard.load();
  let runs = 0;
  const a = app({ guard }, (req, res) => {
    runs += 1;
    res.setHeader('set-cookie', ['a=1', 'b=2']);
    res.setHeader('keep-alive', 'timeout=5');
    res.writeHead(202, { 'content-type': 'text/plain', 'x-run': String(runs) });
    res.write('chunk 1, ');
    res.write(Buffer.from('chunk 2, '));
    res.end('end', 'utf8');
  });
  await serve(a, async (url) => {
    const first = await post(`${url}/orders`, 'k', 'x');
    const again = await post(`${url}/orders`, 'k', 'x');
    for (const r of [first, again]) {
      assert.equal(r.status, 202);
      assert.equal(await r.text(), 'chunk 1, chunk 2, end');
      assert.deepEqual(r.headers.getSetCookie(), ['a=1', 'b=2']);
      assert.equal(r.headers.get('x-run'), '1');
    }
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
  });
  const record = guard.store.peek(scopedKey(undefined, 'k'), Date.now());
  const names = record.record.response.headers.map(([n]) => n);
  assert.ok(!names.includes('keep-alive') && names.includes('set-cookie'), names.join());
});

test('a response over maxResponseBytes is a stored 502 problem: the route never runs again', async () => {
  const guard = Guard.load({ maxResponseBytes: 1024 });
  let runs = 0;
  const a = app({ guard }, (req, res) => {
    runs += 1;
    res.status(200).send('x'.repeat(2000));
  });
  await serve(a, async (url) => {
    const first = await post(`${url}/orders`, 'big', 'x');
    const again = await post(`${url}/orders`, 'big', 'x');
    assert.equal(first.status, 502);
    assert.equal((await first.json()).type, 'https://idem.dev/problems/response-too-large');
    assert.deepEqual([again.status, again.headers.get('idempotent-replayed'), runs], [502, 'true', 1]);
  });
});

test('a completion the store refuses is a 503 response-not-recorded, and the response is not given out', async () => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, leaseMs: 2000 });
  const a = app({ guard }, (req, res) => {
    store.fault('replace', { kind: 'error', message: 'disk full', count: 1 });
    res.status(201).send('secret');
  });
  await serve(a, async (url) => {
    const r = await post(`${url}/orders`, 'k', 'x');
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '2');
    const body = await r.json();
    assert.equal(body.type, 'https://idem.dev/problems/response-not-recorded');
    assert.ok(!JSON.stringify(body).includes('secret'));
  });
});

test('a route that never answers gets a 504 after timeoutMs, and its key is released', async () => {
  const guard = Guard.load();
  let runs = 0;
  const a = app({ guard, timeoutMs: 50 }, (req, res) => {
    runs += 1;
    if (runs === 2) res.status(201).send('second');
  });
  await serve(a, async (url) => {
    const r = await post(`${url}/orders`, 'k', 'x');
    assert.equal(r.status, 504);
    assert.equal((await r.json()).type, 'https://idem.dev/problems/upstream-timeout');
    const retry = await post(`${url}/orders`, 'k', 'x');
    assert.deepEqual([retry.status, await retry.text(), runs], [201, 'second', 2]);
  });
});

test('a body over maxRequestBytes is 413 and nothing is claimed', async () => {
  const guard = Guard.load();
  const a = app({ guard, maxRequestBytes: 10 }, (req, res) => res.status(201).end());
  await serve(a, async (url) => {
    const r = await post(`${url}/orders`, 'k', 'x'.repeat(11));
    assert.equal(r.status, 413);
    assert.equal(guard.store.peek(scopedKey(undefined, 'k'), Date.now()), undefined);
  });
});

test('keys parse as the gateway parses them; scopes hash the client header', () => {
  assert.deepEqual(idempotencyKey('"8e03978e-40d5"'), { key: '8e03978e-40d5' });
  assert.deepEqual(idempotencyKey('"a \\"b\\\\"'), { key: 'a "b\\' });
  assert.deepEqual(idempotencyKey('order-1'), { key: 'order-1' });
  assert.match(idempotencyKey('"open').error, /closing/);
  assert.match(idempotencyKey('has space').error, /0x20/);
  assert.match(idempotencyKey('""').error, /empty/);
  assert.match(idempotencyKey('k'.repeat(201)).error, /limit is 200/);
  assert.match(idempotencyKey('"a\\nb"').error, /escape/);
  assert.match(idempotencyKey('caf\u00e9').error, /0xe9/);
  assert.equal(scopedKey(undefined, 'k'), 'anon/k');
  const [a, b] = [scopedKey('Bearer alice', 'k'), scopedKey('Bearer bob', 'k')];
  assert.notEqual(a, b);
  assert.equal(a.length, 18);
  assert.ok(!a.includes('alice'));
});
