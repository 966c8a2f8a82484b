// The examples as a user runs them, through the installed package
// (`@idem/guard`, linked from ../../packages/js): the README's snippet is
// pay.js and charges once per order; the HTTP example charges once per
// Idempotency-Key and replays the bytes. The guard's own tests are in
// packages/js/test.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { Guard, ManualClock, MemoryStore } from '@idem/guard';
import { pay } from '../pay.js';
import { ordersHandler } from '../http-server.js';

test('the README snippet is pay.js, and it charges once per order', async () => {
  const source = readFileSync(new URL('../pay.js', import.meta.url), 'utf8').trim();
  const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
  assert.ok(readme.includes(source), 'examples/README.md must show pay.js verbatim');

  const charges = [];
  const ledger = { charge: async (orderId, cents, fence) => (charges.push(orderId), { orderId, cents, fence: Number(fence), n: charges.length }) };
  const first = await pay(ledger, 'o-1', 1000);
  const again = await pay(ledger, 'o-1', 1000);
  assert.deepEqual(again, first);
  assert.deepEqual(charges, ['o-1']);
  await assert.rejects(pay(ledger, 'o-1', 2000), /not run: conflict/);
  assert.deepEqual(charges, ['o-1']);
});

test('the HTTP example charges once per Idempotency-Key and replays the bytes', async (t) => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock: new ManualClock(1_000_000), leaseMs: 1_000, retentionMs: 60_000 });
  let charges = 0;
  const server = createServer(ordersHandler(guard, async (order, fence) => ({ id: ++charges, fence: Number(fence), ...order })));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => server.close());
  const url = `http://127.0.0.1:${server.address().port}/orders`;
  const post = (key, body) => fetch(url, { method: 'POST', headers: key ? { 'idempotency-key': key } : {}, body });

  const first = await post('o-1', '{"sku":"A"}');
  assert.equal(first.status, 201);
  const firstBody = await first.text();
  assert.equal(JSON.parse(firstBody).id, 1);
  const again = await post('o-1', '{"sku":"A"}');
  assert.equal(again.status, 201);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('content-type'), 'application/json');
  assert.equal(await again.text(), firstBody);
  assert.equal((await post('o-1', '{"sku":"B"}')).status, 422);
  assert.equal((await post(null, '{"sku":"A"}')).status, 400);
  assert.equal(charges, 1);

  store.fault('insert', { kind: 'error', message: 'connection refused' });
  const down = await post('o-2', '{"sku":"A"}');
  assert.equal(down.status, 503);
  assert.equal(down.headers.get('retry-after'), '1');
  const told = await down.text();
  assert.match(told, /retry in 1 s/);
  assert.doesNotMatch(told, /connection refused/, 'the store\'s error is for the log, not the client');
  assert.equal(charges, 1);
  store.clearFaults();
  assert.equal((await post('o-2', '{"sku":"A"}')).status, 201);
  assert.equal(charges, 2);
});
