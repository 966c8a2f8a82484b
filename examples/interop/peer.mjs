// A Node.js service's guard, driven line by line from stdin by
// test_interop.py: each line a JSON command, each answer a JSON line.
// u64s travel as decimal strings; claims stay here, named by an id.
//
//   {"op":"open","store":"redis"|"postgres","url":…,"prefix"|"table":…,"leaseMs":…}
//   {"op":"open","store":"dynamodb","endpoint":…,"region":…,"table":…,"timeoutMs":…,"leaseMs":…}
//   {"op":"begin","key":…,"fingerprint":…}   → {"tag":"proceed","claim":ID,"fence":…} | {"tag":"replay","response":…} | …
//   {"op":"complete","claim":ID,"response":{"status":…,"headers":[[name,hex]],"body":hex}}
//   {"op":"clock"}                           → {"nowMs":…,"errorMs":…,"wallOffsetMs":…,"authority":…}
//   {"op":"close"}
//
// The guard judges leases by its store's clock (contract 0.3): the Redis or
// PostgreSQL server's, whatever this process's wall clock says; `clock`
// tells how far this process's wall clock is from it (a test may run this
// peer under faketime).
import { createInterface } from 'node:readline';
import { Guard, GuardError, wallOffsetMs } from '../../packages/js/index.js';

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (s) => new Uint8Array(Buffer.from(s, 'hex'));
const wire = (r) => ({ status: r.status, headers: r.headers.map(([n, v]) => [n, hex(v)]), body: hex(r.body) });

let guard;
let store;
const claims = new Map();

async function open({ store: kind, url, prefix, table, leaseMs, endpoint, region, timeoutMs }) {
  if (kind === 'redis') {
    const { RedisStore } = await import('../../packages/js/redis.js');
    store = await RedisStore.open({ url, prefix });
  } else if (kind === 'dynamodb') {
    const { DynamoDbStore } = await import('../../packages/js/dynamodb.js');
    store = await DynamoDbStore.open({ endpoint, region, table, timeoutMs });
  } else {
    const { PostgresStore } = await import('../../packages/js/postgres.js');
    store = await PostgresStore.open({ url, table });
  }
  guard = Guard.load({ store, leaseMs, renewLease: false });
  return { ok: true };
}

async function handle(cmd) {
  switch (cmd.op) {
    case 'open':
      return open(cmd);
    case 'begin': {
      const d = await guard.begin(cmd.key, cmd.fingerprint);
      if (d.tag === 'proceed') {
        const id = String(claims.size + 1);
        claims.set(id, d.val);
        return { tag: 'proceed', claim: id, fence: String(d.val.fence) };
      }
      if (d.tag === 'replay') return { tag: 'replay', response: wire(d.val) };
      if (d.tag === 'in-flight') return { tag: 'in-flight', retryAfterMs: String(d.val) };
      return { tag: d.tag };
    }
    case 'complete': {
      const r = cmd.response;
      await guard.complete(claims.get(cmd.claim), {
        status: r.status,
        headers: r.headers.map(([n, v]) => [n, unhex(v)]),
        body: unhex(r.body),
      });
      return { ok: true };
    }
    case 'clock':
      return { nowMs: String(guard.clock.nowMs()), errorMs: guard.clock.errorMs(), wallOffsetMs: wallOffsetMs(guard.clock), authority: guard.clock.authority };
    case 'close':
      await store?.close?.();
      return { ok: true };
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  let answer;
  try {
    answer = await handle(JSON.parse(line));
  } catch (e) {
    answer = e instanceof GuardError ? { error: e.kind, detail: e.detail } : { error: 'exception', detail: String(e?.stack ?? e) };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
  if (JSON.parse(line).op === 'close') process.exit(0);
}
