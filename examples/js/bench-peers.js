// @idem/guard against node-idempotency (@node-idempotency/core 1.0.11, the
// peer issue #43 measured), side by side in one run: `guard.run` with the
// real `fingerprint()` computed per call, and the Express middleware over
// HTTP, against node-idempotency's `onRequest` + `onResponse` (which hash
// each request's JSON body with BLAKE2s) and the same wrapped as Express
// middleware — in memory (MemoryStore; node-idempotency's memory adapter)
// and on the same Redis (RedisStore; its node-redis adapter), on new keys
// and on replays. Beside them the floors: on Redis the bare RESP round trips
// either must make (a new key: a claim, then a write of the response; a
// replay: node-idempotency two, the guard one), over this package's own
// connection (resp.js) with nothing decided; over HTTP, the same Express app
// with no idempotency at all.
//
// Within each group the rows take turns every twentieth of the calls (the
// order reversed every other round), so a busy machine slows them alike; the
// median round is printed, wall-clock and this process's CPU time per call
// (the HTTP rows' client runs in this process too), and each row over the
// group's node-idempotency row. Keys go under `idembench_peers_{pid}:`,
// removed afterwards.
//
//   node bench-peers.js [OPS] [ROUNDS] [GROUP_FILTER] [--before DIR]
//
// with IDEM_TEST_REDIS_URL (default redis://127.0.0.1:6379). `--before DIR`
// adds, to every group, the same @idem/guard row run by another copy of the
// package (DIR: its packages/js, e.g. an older commit's from `git archive`,
// with its idem-guard.wasm and store-layout/ in place), in the same turns.

import { readFileSync } from 'node:fs';
import http from 'node:http';
import { pathToFileURL } from 'node:url';
import { fingerprint, Guard, MemoryStore } from '@idem/guard';
import { idempotency } from '@idem/guard/express';
import { RedisStore } from '@idem/guard/redis';
import { Idempotency } from '@node-idempotency/core';
import { MemoryStorageAdapter } from '@node-idempotency/storage-adapter-memory';
import { RedisStorageAdapter } from '@node-idempotency/storage-adapter-redis';
import express from 'express';
import { Redis } from 'ioredis';
import { Connection, pack, parseUrl } from '../../packages/js/resp.js';
import { removeKeys, timed } from './bench-turns.js';

const args = process.argv.slice(2);
const beforeAt = args.indexOf('--before');
const beforeDir = beforeAt >= 0 ? args.splice(beforeAt, 2)[1] : null;
const ops = Number(args[0] ?? 2_000);
const rounds = Number(args[1] ?? 5);
const only = args[2] ?? '';
/** The other copy of the package (`--before`): its index, express and redis modules, or null. */
const before =
  beforeDir === null
    ? null
    : Object.fromEntries(
        await Promise.all(['index', 'express', 'redis'].map(async (m) => [m, await import(pathToFileURL(`${beforeDir}/${m}.js`).href)])),
      );
const url = process.env.IDEM_TEST_REDIS_URL || 'redis://127.0.0.1:6379';
const prefix = `idembench_peers_${process.pid}:`;

// One request and one response, the same for every row.
const order = { sku: 'A-100', qty: 1, cents: 1000, currency: 'EUR' };
const orderJson = JSON.stringify(order);
const CONTENT_TYPE = 'application/json';
const response = { status: 201, headers: [['content-type', CONTENT_TYPE]], body: '{"id":"ch_1","status":"paid"}' };

// --- the in-process rows -------------------------------------------------------

/** guard.run with the request's real fingerprint computed per call (by `fp`: this package's, or the `--before` one's). */
function guardRun(guard, fingerprintOf = fingerprint) {
  return async (key) => {
    const fp = fingerprintOf({ method: 'POST', path: '/orders', headers: [['content-type', CONTENT_TYPE]], body: orderJson });
    return (await guard.run(key, fp, async () => response)).outcome;
  };
}

/** node-idempotency as its NestJS interceptor uses it: onRequest, the handler, onResponse. */
function nodeIdempotency(idem) {
  return async (key) => {
    const req = { method: 'POST', path: '/orders', headers: { 'idempotency-key': key, 'content-type': CONTENT_TYPE }, body: order };
    const cached = await idem.onRequest(req);
    if (cached !== undefined) return 'replayed';
    await idem.onResponse(req, { body: response.body, additional: { status: 201, headers: { 'content-type': CONTENT_TYPE } } });
    return 'executed';
  };
}

// --- HTTP: Express apps --------------------------------------------------------

/** node-idempotency as Express middleware: what its NestJS interceptor does, on Express's req/res. */
function nodeIdempotencyMiddleware(idem) {
  return async (req, res, next) => {
    const request = { method: req.method, path: req.path, headers: req.headers, body: req.body };
    let cached;
    try {
      cached = await idem.onRequest(request);
    } catch (e) {
      return res.status(e.code === 'REQUEST_IN_PROGRESS' ? 409 : 422).json({ error: e.message });
    }
    if (cached !== undefined) {
      res.set(cached.additional?.headers ?? {});
      res.set('idempotent-replayed', 'true');
      return res.status(cached.additional?.status ?? 200).send(cached.body);
    }
    const send = res.send.bind(res);
    res.send = (body) => {
      idem.onResponse(request, { body, additional: { status: res.statusCode, headers: { 'content-type': res.get('content-type') } } }).then(
        () => send(body),
        next,
      );
      return res;
    };
    next();
  };
}

const route = (req, res) => res.status(201).type(CONTENT_TYPE).send(response.body);

function app(kind, options) {
  const a = express();
  a.set('env', 'production');
  a.set('etag', false);
  if (kind === 'idem') a.use(idempotency(options));
  if (kind === 'before') a.use(before.express.idempotency(options));
  if (kind === 'node-idempotency') a.use(express.json(), nodeIdempotencyMiddleware(options));
  if (kind === 'none') a.use(express.json());
  a.post('/orders', route);
  return a;
}

async function listen(a) {
  const server = http.createServer(a);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

/** One POST /orders with `key`, over a kept-alive connection; resolves to the status. */
function post(port, key) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/orders', agent, headers: { 'idempotency-key': key, 'content-type': CONTENT_TYPE, 'content-length': orderJson.length } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      },
    );
    req.on('error', reject);
    req.end(orderJson);
  });
}

const viaHttp = (server) => async (key) => {
  const status = await post(server.address().port, key);
  if (status !== 201) throw new Error(`status ${status}`);
  return 'ok';
};

// --- the set-up ----------------------------------------------------------------

const redisStore = await RedisStore.open({ url, prefix });
const redisGuard = Guard.load({ store: redisStore });
const memoryGuard = Guard.load({ store: new MemoryStore() });
const redisAdapter = new RedisStorageAdapter({ url });
await redisAdapter.connect();
const nodeRedis = new Idempotency(redisAdapter, { cacheKeyPrefix: `${prefix}ni` });
const nodeMemory = new Idempotency(new MemoryStorageAdapter(), {});
const bare = await Connection.open(parseUrl(url), { timeoutMs: 2_000 });
const value = Buffer.concat([Buffer.from('1 99999999999999\n'), Buffer.alloc(120, 1)]); // about a record's size, with the layout's header

/** The RESP round trips with nothing decided: a claim (SET NX) and a write (SET), or one read (GET). */
const floorNew = async (key) => {
  await bare.send(pack(['SET', `${prefix}f:${key}`, value, 'NX', 'PX', '86400000']));
  await bare.send(pack(['SET', `${prefix}f:${key}`, value, 'PX', '86400000']));
  return 'ok';
};
/** The same two round trips as the store's layout has them on a server without `SET … IFEQ`: a claim that reads what it displaced, then the replace script. */
const replaceSha = (await bare.send(pack(['SCRIPT', 'LOAD', readFileSync(new URL('../../wit/store-layout/redis/replace.lua', import.meta.url), 'utf8')]))).toString();
const floorLayout = async (key) => {
  const full = `${prefix}l:${key}`;
  await bare.send(pack(['SET', full, value, 'NX', 'GET', 'PX', '86400000']));
  await bare.send(pack(['EVALSHA', replaceSha, '1', full, '1', '0', '86400000', value]));
  return 'ok';
};
const floorRead = async () => {
  await bare.send(pack(['GET', `${prefix}f:replayed`]));
  return 'ok';
};
await floorNew('replayed');

const servers = {
  'idem memory': await listen(app('idem', { guard: Guard.load({ store: new MemoryStore() }) })),
  'idem redis': await listen(app('idem', { guard: Guard.load({ store: await RedisStore.open({ url, prefix: `${prefix}h:` }) }) })),
  'ni memory': await listen(app('node-idempotency', new Idempotency(new MemoryStorageAdapter(), {}))),
  'ni redis': await listen(app('node-idempotency', new Idempotency(redisAdapter, { cacheKeyPrefix: `${prefix}hni` }))),
  none: await listen(app('none')),
};

/** The same, run by the `--before` package: its guards (own stores, own Redis connection) and Express apps. */
const old = {};
if (before !== null) {
  const { Guard: OldGuard, MemoryStore: OldMemoryStore, fingerprint: oldFingerprint } = before.index;
  const oldRedisStore = await before.redis.RedisStore.open({ url, prefix: `${prefix}b:` });
  old.memory = guardRun(OldGuard.load({ store: new OldMemoryStore() }), oldFingerprint);
  old.redis = guardRun(OldGuard.load({ store: oldRedisStore }), oldFingerprint);
  old.stores = [oldRedisStore];
  servers['before memory'] = await listen(app('before', { guard: OldGuard.load({ store: new OldMemoryStore() }) }));
  const oldHttpStore = await before.redis.RedisStore.open({ url, prefix: `${prefix}bh:` });
  old.stores.push(oldHttpStore);
  servers['before redis'] = await listen(app('before', { guard: OldGuard.load({ store: oldHttpStore }) }));
}

/** Each group: its rows, by name → `(tag) => (i) => a call`; `replay` rows repeat one completed key. */
const fresh = (call) => (tag) => (i) => call(`${tag}${i}`);
const replayed = (call) => (tag) => async () => call(`replayed-${tag.split('-')[0]}`); // one key per row, completed in warm-up
/** An Express group on `store` (memory, redis): each middleware's row (`calls`: fresh or replayed), and Express alone, which keeps nothing (always fresh). */
const overHttp = (store, calls) => ({
  '@idem/guard/express': calls(viaHttp(servers[`idem ${store}`])),
  'node-idempotency': calls(viaHttp(servers[`ni ${store}`])),
  'floor: Express, no idempotency': fresh(viaHttp(servers.none)),
});

const groups = {
  'in memory, new key': {
    '@idem/guard run + fingerprint': fresh(guardRun(memoryGuard)),
    'node-idempotency': fresh(nodeIdempotency(nodeMemory)),
  },
  'in memory, replay': {
    '@idem/guard run + fingerprint': replayed(guardRun(memoryGuard)),
    'node-idempotency': replayed(nodeIdempotency(nodeMemory)),
  },
  'Redis, new key': {
    '@idem/guard run + fingerprint': fresh(guardRun(redisGuard)),
    'node-idempotency': fresh(nodeIdempotency(nodeRedis)),
    'floor: SET NX + SET, bare RESP': fresh(floorNew),
    'floor: SET NX GET + EVALSHA replace': fresh(floorLayout),
  },
  'Redis, replay': {
    '@idem/guard run + fingerprint': replayed(guardRun(redisGuard)),
    'node-idempotency': replayed(nodeIdempotency(nodeRedis)),
    'floor: one GET, bare RESP': () => floorRead,
  },
  'Express over HTTP, in memory, new key': overHttp('memory', fresh),
  'Express over HTTP, in memory, replay': overHttp('memory', replayed),
  'Express over HTTP, Redis, new key': overHttp('redis', fresh),
  'Express over HTTP, Redis, replay': overHttp('redis', replayed),
};

if (before !== null) {
  const add = (group, row) => {
    groups[group] = { [Object.keys(groups[group])[0]]: Object.values(groups[group])[0], [`before: ${Object.keys(groups[group])[0]}`]: row, ...groups[group] };
  };
  add('in memory, new key', fresh(old.memory));
  add('in memory, replay', replayed(old.memory));
  add('Redis, new key', fresh(old.redis));
  add('Redis, replay', replayed(old.redis));
  add('Express over HTTP, in memory, new key', fresh(viaHttp(servers['before memory'])));
  add('Express over HTTP, in memory, replay', replayed(viaHttp(servers['before memory'])));
  add('Express over HTTP, Redis, new key', fresh(viaHttp(servers['before redis'])));
  add('Express over HTTP, Redis, replay', replayed(viaHttp(servers['before redis'])));
}

const results = {};
const block = Math.max(1, Math.floor(ops / 20));
try {
  for (const [group, rows] of Object.entries(groups)) {
    if (only in groups ? group !== only : !group.includes(only)) continue; // a group's exact name, else every group containing it
    results[group] = Object.fromEntries(Object.keys(rows).map((name) => [name, []]));
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? Object.keys(rows) : Object.keys(rows).reverse();
      const calls = Object.fromEntries(order.map((name, n) => [name, rows[name](`${r}-${n}-`)]));
      const spent = Object.fromEntries(order.map((name) => [name, [0, 0]]));
      for (const [n, name] of order.entries()) await timed(0, Math.max(1, Math.floor(ops / 5)), rows[name](`w${r}-${n}-`)); // warm-up
      for (let start = 0; start < ops; start += block) {
        for (const name of order) {
          const [wall, cpu] = await timed(start, Math.min(ops, start + block), calls[name]);
          spent[name][0] += wall;
          spent[name][1] += cpu;
        }
      }
      for (const name of order) results[group][name].push([spent[name][0] / ops, spent[name][1] / ops]);
    }
  }
} finally {
  for (const server of Object.values(servers)) {
    server.closeAllConnections();
    server.close();
  }
  agent.destroy();
  const raw = new Redis(url);
  await removeKeys(raw, prefix);
  raw.disconnect();
  bare.close?.();
  await redisAdapter.disconnect();
  await redisStore.close();
  for (const store of old.stores ?? []) await store.close();
}

const load = (await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
console.log(`node ${process.version}, ${ops} calls per row per round, median of ${rounds} rounds, load average ${load}`);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const [group, rows] of Object.entries(results)) {
  console.log(`${group}:`);
  const peer = rows['node-idempotency'];
  const [peerWall, peerCpu] = [median(peer.map(([w]) => w)), median(peer.map(([, c]) => c))];
  for (const [name, times] of Object.entries(rows)) {
    const wall = median(times.map(([w]) => w));
    const cpu = median(times.map(([, c]) => c));
    console.log(
      `  ${name.padEnd(34)} ${wall.toFixed(1).padStart(8)} µs/op ${cpu.toFixed(1).padStart(8)} cpu-µs/op   ` +
        `${(wall / peerWall).toFixed(2)}x node-idempotency's wall, ${(cpu / peerCpu).toFixed(2)}x its cpu`,
    );
  }
}
process.exit(0);
