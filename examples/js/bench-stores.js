// The cost of one guarded call on Redis from Node.js, next to the raw
// commands of the same claim and completion and to @node-idempotency/core on
// the same server, in one run. Within each round the rows take turns every
// twentieth of the keys (the order reversed every other round), so a busy
// machine, or one that changes speed within seconds, slows them alike; the
// median round is printed, wall-clock and this process's CPU time per call,
// and each row's wall-clock over the raw row's.
// `node bench-stores.js [OPS] [ROUNDS]`, with IDEM_TEST_REDIS_URL (default
// redis://127.0.0.1:6379); keys go under `idembench_js_{pid}:`, removed
// afterwards.
//
// - guarded begin+complete: `AsyncGuard.begin` + `complete` on a new key over
//   `RedisStore` (its own connection, resp.js): one `SET NX GET`, one `EVALSHA replace`, each call
//   replayed from its journal (two runs of the export per call).
// - guard.run: the same through `run`, lease renewal armed.
// - raw SET NX + SET: ioredis's two round trips any claim-then-complete needs,
//   with nothing decided.
// - RedisStore insert + replace: the store's own two commands (`SET NX GET`,
//   `EVALSHA replace`: the compare-and-set a completion needs) with no guard:
//   what the guarded row costs without the component.
// - node-idempotency: `Idempotency.onRequest` + `onResponse` of
//   @node-idempotency/core 1.0.11 over its Redis adapter (node-redis 4).

import { Guard } from '@idem/guard';
import { RedisStore } from '@idem/guard/redis';
import { Idempotency } from '@node-idempotency/core';
import { RedisStorageAdapter } from '@node-idempotency/storage-adapter-redis';
import { Redis } from 'ioredis';
import { removeKeys, timed } from './bench-turns.js';

const ops = Number(process.argv[2] ?? 2_000);
const rounds = Number(process.argv[3] ?? 5);
const url = process.env.IDEM_TEST_REDIS_URL || 'redis://127.0.0.1:6379';
const prefix = `idembench_js_${process.pid}:`;
const response = { status: 200, headers: [['content-type', 'text/plain']], body: 'paid' };
const value = Buffer.alloc(120, 1); // about a record's size

const store = await RedisStore.open({ url, prefix });
const guard = Guard.load({ store });
const raw = new Redis(url);
const adapter = new RedisStorageAdapter({ url });
await adapter.connect();
const idempotency = new Idempotency(adapter, { keyHeader: 'idempotency-key' });

const rows = {
  'raw SET NX + SET (ioredis)': (tag) => async (i) => {
    const key = `${prefix}r:${tag}${i}`;
    if ((await raw.set(key, value, 'PX', 86_400_000, 'NX')) !== 'OK') throw new Error('a new key must be set');
    await raw.set(key, value, 'PX', 86_400_000);
  },
  'RedisStore insert + replace, no guard': (tag) => async (i) => {
    const key = `s:${tag}${i}`;
    const now = store.clock.nowMs();
    const record = { fingerprint: 'x'.repeat(43), state: 'processing', holder: 1n, leaseUntilMs: now + 30_000n, expiresAtMs: now + 86_400_000n };
    const claimed = await store.insert(key, record, now);
    if (claimed.tag !== 'inserted') throw new Error(`a new key must be inserted, got ${claimed.tag}`);
    const done = { ...record, state: 'done', response: { status: 200, headers: [['content-type', Buffer.from('text/plain')]], body: Buffer.from('paid') } };
    if ((await store.replace(key, claimed.val, done, now)) !== true) throw new Error('the claim must be replaced');
  },
  'guarded begin+complete': (tag) => async (i) => {
    const decision = await guard.begin(`g:${tag}${i}`, 'sku=A&qty=1');
    if (decision.tag !== 'proceed') throw new Error(`a new key must proceed, got ${decision.tag}`);
    await guard.complete(decision.val, response);
  },
  'guard.run': (tag) => async (i) => {
    const result = await guard.run(`u:${tag}${i}`, 'sku=A&qty=1', async () => response);
    if (result.outcome !== 'executed') throw new Error(`a new key must execute, got ${result.outcome}`);
  },
  'node-idempotency onRequest+onResponse': (tag) => async (i) => {
    const req = {
      method: 'POST',
      path: '/pay',
      headers: { 'idempotency-key': `${prefix}n:${tag}${i}` },
      body: { sku: 'A', qty: 1 },
    };
    if ((await idempotency.onRequest(req)) !== undefined) throw new Error('a new key must proceed');
    await idempotency.onResponse(req, { body: 'paid', additional: { status: 200 } });
  },
};

const results = Object.fromEntries(Object.keys(rows).map((name) => [name, []]));
const block = Math.max(1, Math.floor(ops / 20));
try {
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? Object.keys(rows) : Object.keys(rows).reverse();
    const calls = Object.fromEntries(order.map((name) => [name, rows[name](`${r}-`)]));
    const spent = Object.fromEntries(order.map((name) => [name, [0, 0]]));
    for (const name of order) await timed(0, Math.max(1, Math.floor(ops / 10)), rows[name](`w${r}-`));
    for (let start = 0; start < ops; start += block) {
      for (const name of order) {
        const [wall, cpu] = await timed(start, Math.min(ops, start + block), calls[name]);
        spent[name][0] += wall;
        spent[name][1] += cpu;
      }
    }
    for (const name of order) results[name].push([spent[name][0] / ops, spent[name][1] / ops]);
  }
} finally {
  await removeKeys(raw, prefix);
  raw.disconnect();
  await adapter.disconnect();
  await store.close();
}

const load = (await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
console.log(`load average: ${load}`);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const base = median(results['raw SET NX + SET (ioredis)'].map(([wall]) => wall));
for (const [name, times] of Object.entries(results)) {
  const wall = median(times.map(([w]) => w));
  const cpu = median(times.map(([, c]) => c));
  console.log(
    `node    ${name.padEnd(40)} ${String(ops).padStart(6)} ops  ${wall.toFixed(1).padStart(8)} µs/op  ${cpu.toFixed(1).padStart(7)} cpu-µs/op  ` +
      `(median of ${rounds})  ${(wall / base).toFixed(2)}x its raw row`,
  );
}
