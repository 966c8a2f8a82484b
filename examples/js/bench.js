// The cost of one guarded call in Node.js, through the component, over the
// Map store, with each binding: `jco` (jco 1.35's transpiled glue, the binding
// before issue 17) and `abi` (idem-abi.js, the guard's); and `composed`, the
// guard composed with the store component (examples/store-component, its
// records inside the component) through jco's glue, what a host of a store
// written as a component runs (`Guard.load`'s own store is then unused: see
// packages/js/testing/store-component.js); and `abi+store`, idem-abi.js with
// the store component alone as its store, only the store calls through jco's
// glue (the workaround the README names). Each measurement runs
// in a child process of its own, so one binding's JIT feedback and heap do not
// slow the other; rounds alternate the bindings so a busy machine slows both
// alike. The median round is printed (wall-clock and the child's CPU time per
// call: on a shared machine the two part when the process waits for a core),
// then the ratio. For examples/bench-hosts.sh. `node bench.js [OPS] [ROUNDS]`
//
// - begin+complete: a new key, as examples/bench-hosts.sh compares across hosts.
// - run: `guard.run` on a new key with lease renewal armed (the default).
// - replay: `begin` on a completed key.

import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Guard, MemoryStore } from '@idem/guard';
// The reference binding lives beside the package, not in it (it needs jco and
// the transpiled glue: `npm ci && npm run transpile` in packages/js).
import { jcoGuest } from '../../packages/js/jco-guest.js';
// The compositions of scripts/compose-store.sh (IDEM_STORE_COMPONENTS, or it runs the script).
import { componentStore, composedGuest, PLUGGED } from '../../packages/js/testing/store-component.js';

const child = process.argv[2] === '--child';
const ops = Number(process.argv[2] ?? 20_000);
const rounds = Number(process.argv[3] ?? 5);
const response = { status: 200, headers: [['content-type', 'text/plain']], body: 'paid' };
// The jco glue is an order of magnitude slower: a quarter of the ops is plenty.
const bindings = {
  jco: { guest: () => jcoGuest(), what: 'jco 1.35 glue', ops: Math.max(5_000, Math.floor(ops / 4)) },
  composed: { guest: () => composedGuest(PLUGGED), what: 'jco 1.35 glue, store component inside', ops: Math.max(5_000, Math.floor(ops / 4)) },
  'abi+store': {
    guest: async () => undefined,
    store: componentStore,
    what: 'idem-abi.js, the store component its store',
    ops: Math.max(5_000, Math.floor(ops / 4)),
  },
  abi: { guest: async () => undefined, what: 'idem-abi.js', ops },
};

function beginComplete(guard, key) {
  const decision = guard.begin(key, 'sku=A&qty=1');
  if (decision.tag !== 'proceed') throw new Error(`a new key must proceed, got ${decision.tag}`);
  guard.complete(decision.val, response);
}

async function run(guard, key) {
  if ((await guard.run(key, 'sku=A&qty=1', async () => response)).outcome !== 'executed') throw new Error('a new key must execute');
}

function replay(guard) {
  if (guard.begin('done', 'sku=A&qty=1').tag !== 'replay') throw new Error('a completed key must replay');
}

const calls = { 'begin+complete': beginComplete, run, replay };

async function measure({ guest, store = () => new MemoryStore() }, call, ops, round) {
  const guard = Guard.load({ store: await store(), guest: await guest() });
  beginComplete(guard, 'done');
  const fn = calls[call];
  // A fresh process needs tens of thousands of calls before the wasm is tiered
  // up from Liftoff and the JS optimized: the first 20,000 cost twice the next.
  for (let i = 0; i < Math.max(10_000, 2 * ops); i++) await fn(guard, `warm-${round}-${i}`);
  const cpu = process.cpuUsage();
  const start = process.hrtime.bigint();
  if (call === 'run') for (let i = 0; i < ops; i++) await fn(guard, `order-${round}-${i}`);
  else for (let i = 0; i < ops; i++) fn(guard, `order-${round}-${i}`);
  const wall = Number(process.hrtime.bigint() - start) / ops;
  const { user, system } = process.cpuUsage(cpu);
  return { wall, cpu: ((user + system) * 1000) / ops };
}

if (child) {
  // node bench.js --child BINDING CALL OPS ROUND: one measurement, as JSON.
  const [binding, call, n, round] = process.argv.slice(3);
  console.log(JSON.stringify(await measure(bindings[binding], call, Number(n), Number(round))));
  process.exit(0);
}

const results = new Map();
for (let round = 0; round < rounds; round++) {
  for (const call of Object.keys(calls)) {
    const order = round % 2 === 0 ? Object.keys(bindings) : Object.keys(bindings).reverse();
    for (const binding of order) {
      const args = [fileURLToPath(import.meta.url), '--child', binding, call, String(bindings[binding].ops), String(round)];
      const key = `${binding} ${call}`;
      results.set(key, [...(results.get(key) ?? []), JSON.parse(execFileSync(process.execPath, args, { encoding: 'utf8' }))]);
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const wall = (key) => median(results.get(key).map((r) => r.wall));
const cpu = (key) => median(results.get(key).map((r) => r.cpu));
const ns = (n) => Math.round(n).toString().padStart(9);
for (const [binding, { what, ops }] of Object.entries(bindings)) {
  for (const call of Object.keys(calls)) {
    const key = `${binding} ${call}`;
    console.log(
      `node    ${process.version.padEnd(17)} ${call.padEnd(15)} ${String(ops).padStart(6)} ops  ${ns(wall(key))} ns/op  ${ns(cpu(key))} cpu-ns/op  (${binding}: ${what}, median of ${rounds})`,
    );
  }
}
for (const binding of ['jco', 'composed', 'abi+store']) {
  for (const call of Object.keys(calls)) {
    const ratio = wall(`${binding} ${call}`) / wall(`abi ${call}`);
    const cpuRatio = cpu(`${binding} ${call}`) / cpu(`abi ${call}`);
    console.log(`node    ${`${binding}/abi`.padEnd(17)} ${call.padEnd(15)} ${ratio.toFixed(1).padStart(6)}x wall  ${cpuRatio.toFixed(1).padStart(6)}x cpu`);
  }
}
