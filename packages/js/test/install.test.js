// The package as a user gets it: `npm pack`, an empty project, `npm install
// --offline` of the tarball alone (the package has no dependencies, and its
// peers express and pg are optional, so nothing else is fetched), then a
// program that imports `@idem/guard` with no IDEM_COMPONENT set. Then the
// project installs pg, offline from npm's cache (`npm ci` here put
// its tarballs there, not their registry metadata: so the project's lock
// gets them pinned as this package's lock pins them, then `npm ci --offline`
// fetches nothing), and guards a call on Redis (which needs no client
// package: RedisStore has its own connection) and on PostgreSQL through
// `@idem/guard/redis` and `@idem/guard/postgres` (IDEM_TEST_REDIS_URL and
// IDEM_TEST_POSTGRES_URL, as in testing/netstores.js). And its types: a
// TypeScript program type-checked against the installed declarations (with
// tsc from this package's devDependencies, when installed), and each
// declaration file names every export of its module. Needs the component and
// the layout's files in the package: build.sh copies both.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { dropTable, serverUrl, skipWithout, unique } from '../testing/netstores.js';

const pkg = fileURLToPath(new URL('..', import.meta.url));
const manifest = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8'));

// A user's environment: none of the variables `npm test` sets for itself,
// and no IDEM_COMPONENT (the installed package must find its own component).
const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('npm_') && name !== 'IDEM_COMPONENT'));
const sh = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

let dir;
let app;

before(() => {
  assert.ok(existsSync(join(pkg, 'idem-guard.wasm')), 'no idem-guard.wasm in the package: run packages/js/build.sh first');
  assert.ok(existsSync(join(pkg, 'store-layout', 'redis', 'replace.lua')), 'no store-layout/ in the package: run packages/js/build.sh first');
  dir = mkdtempSync(join(tmpdir(), 'idem-guard-install-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  const tarball = join(dir, sh('npm', ['pack', '--silent', '--pack-destination', dir], pkg).trim());
  app = join(dir, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
  sh('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], app);
});

test('the package is ESM with exports, types and no runtime dependencies', () => {
  assert.equal(manifest.name, '@idem/guard');
  assert.equal(manifest.version, '0.3.0');
  assert.equal(manifest.type, 'module');
  assert.deepEqual(manifest.exports['.'], { types: './index.d.ts', default: './index.js' });
  assert.deepEqual(manifest.exports['./redis'], { types: './redis.d.ts', default: './redis.js' });
  assert.deepEqual(manifest.exports['./postgres'], { types: './postgres.d.ts', default: './postgres.js' });
  assert.deepEqual(manifest.exports['./dynamodb'], { types: './dynamodb.d.ts', default: './dynamodb.js' });
  assert.equal(manifest.dependencies, undefined);
  assert.deepEqual(manifest.peerDependenciesMeta, {
    '@aws-sdk/client-dynamodb': { optional: true },
    '@opentelemetry/api': { optional: true },
    express: { optional: true },
    pg: { optional: true },
  });
  const installed = join(app, 'node_modules', '@idem', 'guard');
  assert.deepEqual(readdirSync(installed).sort(), [
    'README.md',
    'clock.js',
    'dynamodb.d.ts',
    'dynamodb.js',
    'express.d.ts',
    'express.js',
    'fingerprint.js',
    'idem-abi.js',
    'idem-guard.wasm',
    'index.d.ts',
    'index.js',
    'journal.js',
    'layout.js',
    'package.json',
    'postgres.d.ts',
    'postgres.js',
    'redis.d.ts',
    'redis.js',
    'resp.js',
    'server-store.d.ts',
    'server-store.js',
    'store-layout',
    'telemetry.js',
  ]);
  assert.deepEqual(readFileSync(join(installed, 'idem-guard.wasm')), readFileSync(join(pkg, 'idem-guard.wasm')));
  // The layout's files as they are in wit/store-layout/.
  for (const file of [
    'redis/claim_expired.lua',
    'redis/replace.lua',
    'redis/delete_at.lua',
    'redis/time.lua',
    'postgres/schema.sql',
    'postgres/statements.sql',
  ]) {
    assert.equal(readFileSync(join(installed, 'store-layout', file), 'utf8'), readFileSync(join(pkg, '..', '..', 'wit', 'store-layout', file), 'utf8'), file);
  }
  // The optional peers are not installed with it.
  assert.deepEqual(readdirSync(join(app, 'node_modules')), ['.package-lock.json', '@idem']);
});

test('an installed package guards a function: the side effect runs once, the repeat replays the same bytes', () => {
  writeFileSync(
    join(app, 'main.js'),
    `import { fingerprint, Guard, MemoryStore } from '@idem/guard';

const guard = Guard.load({ store: new MemoryStore() });
let charges = 0;
const charge = async (fence) => {
  charges += 1;
  return { status: 201, headers: [['content-type', 'application/json']], body: JSON.stringify({ charge: charges, fence: String(fence) }) };
};
const request = { method: 'POST', path: '/orders', body: 'cents=1000' };
if (fingerprint(request) !== guard.fingerprint(request)) throw new Error('native and component fingerprints differ');
const first = await guard.run('order-1', fingerprint(request), charge);
const again = await guard.run('order-1', fingerprint(request), charge);
const hex = (r) => Buffer.from(r.response.body).toString('hex');
console.log(JSON.stringify({ charges, outcomes: [first.outcome, again.outcome], bodies: [hex(first), hex(again)], status: again.response.status }));
`,
  );
  const got = JSON.parse(sh('node', ['main.js'], app));
  assert.equal(got.charges, 1);
  assert.deepEqual(got.outcomes, ['executed', 'replayed']);
  assert.equal(got.bodies[1], got.bodies[0]);
  assert.deepEqual(JSON.parse(Buffer.from(got.bodies[1], 'hex').toString()), {
    charge: 1,
    fence: JSON.parse(Buffer.from(got.bodies[0], 'hex').toString()).fence,
  });
  assert.equal(got.status, 201);
});

test('the installed Express middleware runs on plain node:http, without express installed', () => {
  writeFileSync(
    join(app, 'express-main.js'),
    `import { createServer } from 'node:http';
import { Guard } from '@idem/guard';
import { idempotency } from '@idem/guard/express';

const guard = Guard.load();
const guarded = idempotency({ guard, requireKey: true });
let runs = 0;
const server = createServer((req, res) =>
  guarded(req, res, (err) => {
    if (err) throw err;
    runs += 1;
    res.setHeader('content-type', 'text/plain');
    res.end('run ' + runs);
  }),
);
server.listen(0, '127.0.0.1', async () => {
  const url = 'http://127.0.0.1:' + server.address().port + '/orders';
  const post = (headers) => fetch(url, { method: 'POST', headers, body: 'x' });
  const first = await post({ 'idempotency-key': 'k' });
  const again = await post({ 'idempotency-key': 'k' });
  const keyless = await post({});
  console.log(JSON.stringify({
    runs,
    bodies: [await first.text(), await again.text()],
    replayed: again.headers.get('idempotent-replayed'),
    keyless: [keyless.status, keyless.headers.get('content-type')],
  }));
  server.close();
});
`,
  );
  const got = JSON.parse(sh('node', ['express-main.js'], app));
  assert.deepEqual(got, { runs: 1, bodies: ['run 1', 'run 1'], replayed: 'true', keyless: [400, 'application/problem+json'] });
});

/**
 * Adds `names` to the project's package.json and package-lock.json with
 * everything they need, at the versions and integrity this package's own
 * lock has: what `npm ci` here installed, so its tarballs are in the cache.
 */
function pinPeers(project, names) {
  const source = JSON.parse(readFileSync(join(pkg, 'package-lock.json'), 'utf8')).packages;
  const lock = JSON.parse(readFileSync(join(project, 'package-lock.json'), 'utf8'));
  const app = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8'));
  // Node's resolution: the nearest node_modules/NAME from `from` up to the root.
  const resolve = (from, name) => {
    for (let dir = from; ; dir = dir.slice(0, Math.max(0, dir.lastIndexOf('/node_modules/')))) {
      const path = `${dir ? `${dir}/` : ''}node_modules/${name}`;
      if (source[path]) return path;
      if (!dir) return null;
    }
  };
  const todo = names.map((name) => resolve('', name));
  for (const name of names) app.dependencies[name] = source[`node_modules/${name}`].version;
  while (todo.length) {
    const path = todo.pop();
    if (lock.packages[path]) continue;
    const { dev, devOptional, ...entry } = source[path];
    lock.packages[path] = entry;
    for (const name of Object.keys(entry.dependencies ?? {})) todo.push(resolve(path, name));
    // Optional ones the lock has (pg-cloudflare); a platform's missing one is skipped, as npm does.
    for (const name of Object.keys(entry.optionalDependencies ?? {})) if (resolve(path, name)) todo.push(resolve(path, name));
  }
  lock.packages[''].dependencies = app.dependencies;
  writeFileSync(join(project, 'package.json'), JSON.stringify(app));
  writeFileSync(join(project, 'package-lock.json'), JSON.stringify(lock, null, 2));
}

test('with pg installed from the cache (and no Redis client), an installed package guards a call on Redis and on PostgreSQL', {
  skip: skipWithout('IDEM_TEST_REDIS_URL') || skipWithout('IDEM_TEST_POSTGRES_URL'),
}, async () => {
  const redisUrl = serverUrl('IDEM_TEST_REDIS_URL');
  const postgresUrl = serverUrl('IDEM_TEST_POSTGRES_URL');
  pinPeers(app, ['pg']);
  sh('npm', ['ci', '--offline', '--no-audit', '--no-fund', '--loglevel=error'], app);
  writeFileSync(
    join(app, 'netstores.js'),
    `import { Guard } from '@idem/guard';
import { RedisStore } from '@idem/guard/redis';
import { PostgresStore } from '@idem/guard/postgres';

const stores = {
  redis: await RedisStore.open({ url: process.env.REDIS_URL, prefix: process.env.NAME + ':' }),
  postgres: await PostgresStore.open({ url: process.env.POSTGRES_URL, table: process.env.NAME }),
};
const out = {};
for (const [name, store] of Object.entries(stores)) {
  const guard = Guard.load({ store });
  let charges = 0;
  const charge = async (fence, attempt) => {
    charges += 1;
    await attempt.saveCheckpoint('charged', 'ch-1');
    return { status: 201, body: name + ' fence ' + fence };
  };
  const first = await guard.run('order-1', 'fp', charge);
  const again = await guard.run('order-1', 'fp', charge);
  const body = (r) => Buffer.from(r.response.body).toString();
  out[name] = { async: guard.async, charges, outcomes: [first.outcome, again.outcome], bodies: [body(first), body(again)] };
  await store.close();
}
console.log(JSON.stringify(out));
`,
  );
  const name = unique();
  try {
    const got = JSON.parse(
      execFileSync('node', ['netstores.js'], { cwd: app, env: { ...env, REDIS_URL: redisUrl, POSTGRES_URL: postgresUrl, NAME: name }, encoding: 'utf8' }),
    );
    for (const store of ['redis', 'postgres']) {
      assert.deepEqual(got[store], { async: true, charges: 1, outcomes: ['executed', 'replayed'], bodies: [`${store} fence 1`, `${store} fence 1`] }, store);
    }
  } finally {
    await dropTable(postgresUrl, name);
    const { Redis } = await import('ioredis');
    const raw = new Redis(redisUrl);
    await raw.del(`${name}:order-1`);
    raw.disconnect();
  }
});

test('each declaration file names every export of its module, and nothing else', async () => {
  for (const [module, types] of [
    ['../index.js', 'index.d.ts'],
    ['../redis.js', 'redis.d.ts'],
    ['../postgres.js', 'postgres.d.ts'],
    ['../dynamodb.js', 'dynamodb.d.ts'],
    ['../server-store.js', 'server-store.d.ts'],
  ]) {
    const runtime = Object.keys(await import(module)).sort();
    const declared = [...readFileSync(join(pkg, types), 'utf8').matchAll(/^export declare (?:class|const|function) (\w+)/gm)].map((m) => m[1]).sort();
    assert.deepEqual(declared, runtime, types);
  }
});

const tsc = [join(pkg, 'node_modules', '.bin', 'tsc'), fileURLToPath(new URL('../../../examples/js/node_modules/.bin/tsc', import.meta.url))].find(existsSync);

test('express.d.ts names every export of express.js, and nothing else', async () => {
  const runtime = Object.keys(await import('../express.js')).sort();
  const declared = [...readFileSync(join(pkg, 'express.d.ts'), 'utf8').matchAll(/^export declare (?:class|const|function) (\w+)/gm)].map((m) => m[1]).sort();
  assert.deepEqual(declared, runtime);
});

test('a TypeScript program type-checks against the installed types', { skip: !tsc && 'no tsc installed (npm ci in packages/js)' }, () => {
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', types: [] },
      files: ['check.ts'],
    }),
  );
  writeFileSync(
    join(app, 'check.ts'),
    `import { Guard, GuardError, MemoryStore, NotRecordedError, StoreError, ManualClock, toResponse } from '@idem/guard';
import type { AsyncAttempt, AsyncGuard, Attempt, Claim, Decision, PurgeStats, Response, RunResult, Store } from '@idem/guard';
import { idempotency, keepRawBody, scopedKey } from '@idem/guard/express';
import type { Middleware, RequestLike } from '@idem/guard/express';
import { RedisStore } from '@idem/guard/redis';
import { PostgresStore } from '@idem/guard/postgres';

const store: Store = new MemoryStore();
const guard: Guard = Guard.load({ store, clock: new ManualClock(0), leaseMs: 30_000, renewLease: true, component: '/srv/idem-guard.wasm' });
Guard.load();

async function main(): Promise<void> {
  const result: RunResult = await guard.run('k', 'fp', async (fence: bigint, attempt: Attempt) => {
    const done = attempt.checkpoint;
    const step = done?.phase === 'charged' ? new TextDecoder().decode(done.data) : null;
    if (step === null) {
      const claim: Claim = attempt.saveCheckpoint('charged', 'ch-1');
      void claim.fence;
    }
    return { status: 201, headers: [['content-type', 'text/plain']], body: \`fence \${fence}\` };
  });
  switch (result.outcome) {
    case 'executed':
    case 'replayed': {
      const body: Uint8Array = result.response.body;
      const until: Date = new Date(result.expiresAtMs);
      void [body, until];
      break;
    }
    case 'in-flight': {
      const ms: number = result.retryAfterMs;
      void ms;
      break;
    }
    case 'conflict':
      break;
    case 'unavailable': {
      const message: string = result.message;
      void message;
    }
  }
  await guard.run('k2', 'fp', (fence) => ({ status: 200, body: new Uint8Array([Number(fence)]) }));

  const decision: Decision = guard.begin('k3', guard.fingerprint({ method: 'POST', path: '/orders', body: '{}' }));
  if (decision.tag === 'proceed') {
    let claim: Claim = guard.renew(decision.val);
    claim = guard.saveCheckpoint(claim, { phase: 'p', data: new Uint8Array() });
    const storedUntil: bigint = guard.complete(claim, { status: 200, body: 'ok' });
    void storedUntil;
  } else if (decision.tag === 'replay') {
    const replayed: Response = decision.val;
    const until: bigint = decision.expiresAtMs;
    void [replayed.headers[0]?.[1].byteLength, until];
  } else if (decision.tag === 'in-flight') {
    const ms: bigint = decision.val;
    void ms;
  }
  const d2 = guard.beginRequest('k4', { method: 'GET', path: '/', headers: [['a', 'b']] });
  if (d2.tag === 'proceed') guard.release(d2.val);

  try {
    guard.begin('', 'fp');
  } catch (e) {
    if (e instanceof GuardError) {
      const kind: 'unavailable' | 'invalid-input' | 'stale-claim' = e.kind;
      void kind;
    }
    if (e instanceof NotRecordedError) void [e.response?.status, e.value];
  }
  const fault = new StoreError('unavailable', 'down');
  void fault.payload.tag;
  void toResponse({ status: 204 }).body;

  // @ts-expect-error a key is a string
  guard.begin(1, 'fp');
  // @ts-expect-error a handler returns a response
  await guard.run('k', 'fp', async () => 'not a response');
  // @ts-expect-error no such outcome
  if (result.outcome === 'done') void 0;

  const guarded: Middleware = idempotency({ guard, requireKey: true, fingerprintHeaders: ['content-type'], clientHeader: null, expiryHeader: 'x-expires' });
  const req: RequestLike = { method: 'POST', url: '/orders', headers: { 'idempotency-key': 'k' } };
  await guarded(req, {}, (err?: unknown) => void err);
  void req.idempotency?.fence;
  void keepRawBody;
  const scoped: string = scopedKey(undefined, 'k');
  void scoped;
  // @ts-expect-error a guard is required
  idempotency({ requireKey: true });
}
void main;

// Over an asynchronous store the guard is an AsyncGuard: its calls return Promises.
async function netstores(): Promise<void> {
  const redis = await RedisStore.open({ url: 'redis://127.0.0.1:6379', prefix: 'shop:', graceMs: 60_000, timeoutMs: 2_000 });
  const onRedis: AsyncGuard = Guard.load({ store: redis, leaseMs: 30_000 });
  const overTls: RedisStore = await RedisStore.open({ url: 'rediss://cache.internal:6380/2', tls: { ca: '-----BEGIN CERTIFICATE-----', servername: 'cache' } });
  void overTls;
  // @ts-expect-error a CA is text or bytes
  await RedisStore.open({ url: 'rediss://cache.internal', tls: { ca: 42 } });
  const decision: Decision = await onRedis.begin('k', 'fp');
  if (decision.tag === 'proceed') {
    let claim: Claim = await onRedis.renew(decision.val);
    claim = await onRedis.saveCheckpoint(claim, { phase: 'p' });
    await onRedis.complete(claim, { status: 200, body: 'ok' });
  }
  const fp: string = onRedis.fingerprint({ method: 'GET', path: '/' });
  void fp;
  await onRedis.run('k', 'fp', async (fence: bigint, attempt: AsyncAttempt) => {
    const claim: Claim = await attempt.saveCheckpoint('charged', 'ch-1');
    void claim;
    return { status: 201, body: \`fence \${fence}\` };
  });
  const postgres = await PostgresStore.open({ url: 'postgres://postgres@127.0.0.1:5432/test', table: 'idem_records', poolSize: 4 });
  const onPostgres = new Guard({ store: postgres, purgeEveryMs: 30_000 });
  const later: Promise<Decision> = onPostgres.beginRequest('k', { method: 'POST', path: '/' });
  void later;
  const freed: number = await postgres.purgeExpired(BigInt(Date.now()), 1_000);
  const stats: PurgeStats = onPostgres.purgeStats;
  void [freed, stats.lastError];
  onPostgres.close();
  // @ts-expect-error Redis drops its keys itself: RedisStore has no purgeExpired
  await redis.purgeExpired(0n, 1);
  const shared: Middleware = idempotency({ guard: onRedis });
  void shared;
  // @ts-expect-error an AsyncGuard's begin is a Promise, not a Decision
  const wrong: Decision = onRedis.begin('k', 'fp');
  void wrong;
  // @ts-expect-error the Attempt of an AsyncGuard's handler saves checkpoints asynchronously
  await onRedis.run('k', 'fp', (_fence, attempt: Attempt) => ({ status: 200 }));
  await redis.close();
  await postgres.close();
}
void netstores;
`,
  );
  try {
    sh(tsc, ['-p', '.'], app);
  } catch (e) {
    assert.fail(`tsc found errors:\n${e.stdout}${e.stderr}`);
  }
});
