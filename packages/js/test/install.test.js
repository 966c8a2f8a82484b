// The package as a user gets it: `npm pack`, an empty project, `npm install
// --offline` of the tarball alone (the package has no dependencies, so
// nothing else is fetched), then a program that imports `@idem/guard` with
// no IDEM_COMPONENT set. And its types: a TypeScript program type-checked
// against the installed index.d.ts (with tsc from this package's
// devDependencies, when installed), and index.d.ts names every export of
// index.js. Needs the component in the package: build.sh writes it.

import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = fileURLToPath(new URL('..', import.meta.url));
const manifest = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8'));

// A user's environment: none of the variables `npm test` sets for itself,
// and no IDEM_COMPONENT (the installed package must find its own component).
const env = Object.fromEntries(
  Object.entries(process.env).filter(([name]) => !name.startsWith('npm_') && name !== 'IDEM_COMPONENT'),
);
const sh = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

let dir;
let app;

before(() => {
  assert.ok(existsSync(join(pkg, 'idem-guard.wasm')), 'no idem-guard.wasm in the package: run packages/js/build.sh first');
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
  assert.equal(manifest.version, '0.2.0');
  assert.equal(manifest.type, 'module');
  assert.deepEqual(manifest.exports['.'], { types: './index.d.ts', default: './index.js' });
  assert.equal(manifest.dependencies, undefined);
  const installed = join(app, 'node_modules', '@idem', 'guard');
  assert.deepEqual(readdirSync(installed).sort(), ['README.md', 'express.d.ts', 'express.js', 'fingerprint.js', 'idem-abi.js', 'idem-guard.wasm', 'index.d.ts', 'index.js', 'package.json']);
  assert.deepEqual(readFileSync(join(installed, 'idem-guard.wasm')), readFileSync(join(pkg, 'idem-guard.wasm')));
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
  assert.deepEqual(JSON.parse(Buffer.from(got.bodies[1], 'hex').toString()), { charge: 1, fence: JSON.parse(Buffer.from(got.bodies[0], 'hex').toString()).fence });
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

test('index.d.ts names every export of index.js, and nothing else', async () => {
  const runtime = Object.keys(await import('../index.js')).sort();
  const declared = [...readFileSync(join(pkg, 'index.d.ts'), 'utf8').matchAll(/^export declare (?:class|const|function) (\w+)/gm)]
    .map((m) => m[1])
    .sort();
  assert.deepEqual(declared, runtime);
});

const tsc = [join(pkg, 'node_modules', '.bin', 'tsc'), fileURLToPath(new URL('../../../examples/js/node_modules/.bin/tsc', import.meta.url))].find(existsSync);

test('express.d.ts names every export of express.js, and nothing else', async () => {
  const runtime = Object.keys(await import('../express.js')).sort();
  const declared = [...readFileSync(join(pkg, 'express.d.ts'), 'utf8').matchAll(/^export declare (?:class|const|function) (\w+)/gm)]
    .map((m) => m[1])
    .sort();
  assert.deepEqual(declared, runtime);
});

test('a TypeScript program type-checks against the installed types', { skip: !tsc && 'no tsc installed (npm ci in packages/js)' }, () => {
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', types: [] }, files: ['check.ts'] }),
  );
  writeFileSync(
    join(app, 'check.ts'),
    `import { Guard, GuardError, MemoryStore, NotRecordedError, StoreError, ManualClock, toResponse } from '@idem/guard';
import type { Attempt, Claim, Decision, Response, RunResult, Store } from '@idem/guard';
import { idempotency, keepRawBody, scopedKey } from '@idem/guard/express';
import type { Middleware, RequestLike } from '@idem/guard/express';

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
      void body;
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
    guard.complete(claim, { status: 200, body: 'ok' });
  } else if (decision.tag === 'replay') {
    const replayed: Response = decision.val;
    void replayed.headers[0]?.[1].byteLength;
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
    if (e instanceof NotRecordedError) void e.response.status;
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

  const guarded: Middleware = idempotency({ guard, requireKey: true, fingerprintHeaders: ['content-type'], clientHeader: null });
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
`,
  );
  try {
    sh(tsc, ['-p', '.'], app);
  } catch (e) {
    assert.fail(`tsc found errors:\n${e.stdout}${e.stderr}`);
  }
});
