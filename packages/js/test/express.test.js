// The Express middleware beyond the shared HTTP scenarios
// (http-conformance.test.js): bodies and body parsers, what is stored of a
// response, the limits, a completion the store refuses, a route that never
// answers.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import express from 'express';
import { idempotency, idempotencyKey, keepRawBody, scopedKey } from '../express.js';
import { Guard, MemoryStore } from '../index.js';
import { serve } from '../testing/serve.js';

const post = (url, key, body, headers = {}) => fetch(url, { method: 'POST', headers: { 'idempotency-key': key, ...headers }, body });

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
  const record = guard.store.peek(scopedKey(undefined, 'k'), guard.clock.nowMs());
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
    assert.ok(!JSON.stringify(body).includes('disk full'), "the store's error is the operator's, not the client's");
    assert.match(body.detail, /Retry after 2 s/);
  });
});

test("a 503 says retry and when, never what the store is or how it failed; the guard's logger gets that", async () => {
  const store = new MemoryStore();
  const logged = [];
  const guard = Guard.load({ store, logger: { warn: (message, fields) => logged.push([message, fields]) } });
  let runs = 0;
  const a = app({ guard }, (req, res) => res.status(201).send(`run ${(runs += 1)}`));
  await serve(a, async (url) => {
    store.fault('insert', { kind: 'error', message: 'connect ECONNREFUSED redis-primary.internal:6379 (ioredis)' });
    const r = await post(`${url}/orders`, 'k', 'x');
    const text = await r.text();
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.deepEqual(JSON.parse(text), {
      type: 'https://idem.dev/problems/store-unavailable',
      title: 'The idempotency store is unavailable',
      status: 503,
      detail: 'the request was not run: its outcome could not be checked. Retry after 1 s',
    });
    for (const secret of ['ECONNREFUSED', 'redis', '6379', 'internal']) assert.ok(!text.includes(secret), `the 503 body names ${secret}`);
    assert.equal(runs, 0);
  });
  assert.equal(logged.length, 1);
  assert.match(logged[0][1].reason, /ECONNREFUSED redis-primary\.internal:6379/);
});

/** An app with the middleware app-wide, then an authentication middleware, then the route (and a catch-all app.use handler). */
function appWithAuth(options, runs) {
  const a = express();
  a.set('env', 'test');
  a.use(idempotency(options));
  a.use((req, res, next) => (req.headers['x-api-token'] === 'secret' ? next() : res.status(401).json({ error: 'unauthorized' })));
  a.post('/orders', (req, res) => res.status(201).send(`order ${(runs.orders += 1)}`));
  a.use('/graphql', (req, res) => res.status(200).send(`graphql ${(runs.graphql += 1)}`)); // a handler outside any route
  return a;
}

test('a 4xx written before the route (authentication, no such route) is not stored: the corrected retry under the same key runs', async () => {
  const runs = { orders: 0, graphql: 0 };
  await serve(appWithAuth({ guard: Guard.load() }, runs), async (url) => {
    const refused = await post(`${url}/orders`, 'k', 'x');
    assert.equal(refused.status, 401);
    assert.equal(refused.headers.get('idempotent-replayed'), null);
    const fixed = await post(`${url}/orders`, 'k', 'x', { 'x-api-token': 'secret' });
    assert.deepEqual([fixed.status, await fixed.text()], [201, 'order 1']);
    const again = await post(`${url}/orders`, 'k', 'x', { 'x-api-token': 'secret' });
    assert.deepEqual([again.status, again.headers.get('idempotent-replayed'), await again.text()], [201, 'true', 'order 1']);
    // No route for the path: Express's 404 is not stored either (the repeat is answered afresh, not replayed).
    assert.equal((await post(`${url}/typo`, 'k2', 'x', { 'x-api-token': 'secret' })).status, 404);
    const missing = await post(`${url}/typo`, 'k2', 'x', { 'x-api-token': 'secret' });
    assert.deepEqual([missing.status, missing.headers.get('idempotent-replayed')], [404, null]);
    // A handler mounted with app.use answers outside any route: its 2xx is stored as usual.
    const first = await post(`${url}/graphql`, 'g', 'q', { 'x-api-token': 'secret' });
    const repeat = await post(`${url}/graphql`, 'g', 'q', { 'x-api-token': 'secret' });
    assert.deepEqual([await first.text(), await repeat.text(), repeat.headers.get('idempotent-replayed')], ['graphql 1', 'graphql 1', 'true']);
  });
  assert.deepEqual(runs, { orders: 1, graphql: 1 });
});

test('storeBeforeRoute: true stores those 4xx too: the retry gets the 401 replayed', async () => {
  const runs = { orders: 0, graphql: 0 };
  await serve(appWithAuth({ guard: Guard.load(), storeBeforeRoute: true }, runs), async (url) => {
    assert.equal((await post(`${url}/orders`, 'k', 'x')).status, 401);
    const retry = await post(`${url}/orders`, 'k', 'x', { 'x-api-token': 'secret' });
    // The same key with another header (not fingerprinted) is the same request: the stored 401.
    assert.deepEqual([retry.status, retry.headers.get('idempotent-replayed')], [401, 'true']);
  });
  assert.equal(runs.orders, 0);
});

test("mounted in a route after its body parser and validation, the validation's 400 is never claimed; the valid retry runs once", async () => {
  const guard = Guard.load();
  let runs = 0;
  const a = express();
  a.set('env', 'test');
  const validate = (req, res, next) => (Number.isInteger(req.body?.cents) ? next() : res.status(400).json({ error: 'cents must be a whole number' }));
  a.post('/orders', express.json({ verify: keepRawBody }), validate, idempotency({ guard }), (req, res) => {
    runs += 1;
    res.status(201).json({ cents: req.body.cents, run: runs });
  });
  await serve(a, async (url) => {
    const json = { 'content-type': 'application/json' };
    assert.equal((await post(`${url}/orders`, 'k', '{"cents": "ten"}', json)).status, 400);
    assert.equal((await post(`${url}/orders`, 'k', '{bad json', json)).status, 400); // body-parser's own 400
    const ok = await post(`${url}/orders`, 'k', '{"cents": 10}', json);
    const again = await post(`${url}/orders`, 'k', '{"cents": 10}', json);
    assert.deepEqual([ok.status, again.status, again.headers.get('idempotent-replayed')], [201, 201, 'true']);
  });
  assert.equal(runs, 1);
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
    assert.equal(guard.store.peek(scopedKey(undefined, 'k'), guard.clock.nowMs()), undefined);
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
