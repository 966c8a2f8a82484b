// The lean binding (idem-abi.js) against the reference (jco's glue, jco's own
// canonical ABI): the same random calls, stores and faults give the same
// answers and the same stored records. And what it refuses: a component whose
// core signatures are not the WIT mirror's.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { AbiViolation, BEGIN_RESULT, CLAIM, DECISION, ENTRY, EXPORTS, GET_RESULT, Guest, IMPORTS, INSERT_RESULT, PARAMS, RECORD } from '../idem-abi.js';
import { Guard, GuardError, ManualClock, MemoryStore, StoreError } from '../index.js';
import { jcoGuest } from '../jco-guest.js';

const component = process.env.IDEM_COMPONENT || fileURLToPath(new URL('../idem-guard.wasm', import.meta.url));

/** A MemoryStore whose next `get`, `insert` or `replace` may answer `corrupt`. */
class Corrupting extends MemoryStore {
  corruptNext = false;
  get(...args) {
    return this.#corrupt('get') ?? super.get(...args);
  }
  insert(...args) {
    return this.#corrupt('insert') ?? super.insert(...args);
  }
  replace(...args) {
    return this.#corrupt('replace') ?? super.replace(...args);
  }
  #corrupt(primitive) {
    if (!this.corruptNext) return undefined;
    this.corruptNext = false;
    throw new StoreError('corrupt', `bytes for ${primitive} do not decode (injected)`);
  }
}

/** A small deterministic generator (mulberry32), so a failure replays. */
function random(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

/** Holder ids from a seeded generator: both bindings draw the same ones. */
function seededRandom(seed) {
  let x = BigInt(seed);
  return { randomU64: () => (x = (x * 6364136223846793005n + 1442695040888963407n) & (2n ** 64n - 1n)) };
}

function outcome(call) {
  try {
    return ['ok', call()];
  } catch (e) {
    if (e instanceof GuardError) return ['error', e.kind, e.detail];
    throw e;
  }
}

test('random calls answer and store the same through both bindings', async () => {
  const rng = random(17);
  const int = (n) => Math.floor(rng() * n);
  const pick = (xs) => xs[int(xs.length)];
  const bytes = (n) => Uint8Array.from({ length: int(n + 1) }, () => int(256));
  const jco = await jcoGuest();
  const sides = [undefined, jco].map((guest) => {
    const store = new Corrupting();
    const clock = new ManualClock(1_000);
    const random = seededRandom(17);
    return { store, clock, guard: Guard.load({ store, clock, random, leaseMs: 50, retentionMs: 400, maxResponseBytes: 64, guest }) };
  });
  const keys = ['a', 'b', 'ключ', 'k\u200b', 'x'.repeat(255)];
  const text = 'aZ-/é Σ日\u00e9';
  const claims = [];
  let checkpointed = 0;
  let storedCheckpoints = 0;
  for (let step = 0; step < 600; step++) {
    const op = pick(['begin', 'begin', 'request', 'complete', 'complete', 'release', 'renew', 'checkpoint', 'clock', 'fault', 'corrupt']);
    let answers;
    if (op === 'clock') {
      const ms = pick([1, 10, 49, 50, 51, 400]);
      for (const s of sides) s.clock.advance(ms);
      continue;
    } else if (op === 'fault') {
      const [primitive, kind] = [pick(['get', 'insert', 'replace']), pick(['error', 'lost'])];
      for (const s of sides) s.store.fault(primitive, { kind, message: 'down', count: 1 });
      continue;
    } else if (op === 'corrupt') {
      for (const s of sides) s.store.corruptNext = true;
      continue;
    } else if (op === 'begin') {
      const [key, fp] = [pick(keys), pick(['fp-1', 'fp-2'])];
      answers = sides.map((s) => outcome(() => s.guard.begin(key, fp)));
      if (answers[0][0] === 'ok' && answers[0][1].tag === 'proceed') claims.push(answers[0][1].val);
    } else if (op === 'request') {
      const key = pick(keys);
      const request = { method: pick(['POST', 'get']), path: pick(['/a', '/ü']), headers: [[pick(['x', 'Y']), bytes(3)]], body: bytes(20) };
      answers = sides.map((s) => outcome(() => s.guard.beginRequest(key, request)));
      if (answers[0][0] === 'ok' && answers[0][1].tag === 'proceed') claims.push(answers[0][1].val);
    } else if (claims.length === 0) {
      continue;
    } else if (op === 'complete') {
      const claim = pick(claims);
      const headers = Array.from({ length: int(4) }, () => [Array.from({ length: 1 + int(6) }, () => pick([...text])).join(''), bytes(5)]);
      const response = { status: pick([200, 201, 404, 99, 1000]), headers, body: bytes(40) };
      answers = sides.map((s) => outcome(() => s.guard.complete(claim, response)));
    } else if (op === 'release') {
      const claim = pick(claims);
      answers = sides.map((s) => outcome(() => s.guard.release(claim)));
    } else if (op === 'checkpoint') {
      const claim = rng() < 0.5 ? claims.at(-1) : pick(claims); // the latest claim is the likeliest current one
      const checkpoint = { phase: pick(['charged', 'é', '', 'x'.repeat(65)]), data: bytes(70) };
      answers = sides.map((s) => outcome(() => s.guard.saveCheckpoint(claim, checkpoint)));
      if (answers[0][0] === 'ok') claims.push(answers[0][1]);
    } else {
      const claim = pick(claims);
      answers = sides.map((s) => outcome(() => s.guard.renew(claim)));
      if (answers[0][0] === 'ok') claims.push(answers[0][1]);
    }
    assert.deepEqual(answers[0], answers[1], `step ${step} (${op})`);
    if (op === 'checkpoint' && answers[0][0] === 'ok') checkpointed += 1;
    const now = sides[0].clock.nowMs();
    const stored = keys.map((k) => sides[0].store.peek(k, now));
    assert.deepEqual(
      stored,
      keys.map((k) => sides[1].store.peek(k, now)),
      `step ${step} (${op}): stored records`,
    );
    storedCheckpoints += stored.filter((e) => e?.record.checkpoint).length;
  }
  assert.deepEqual(
    sides.map((s) => s.guard.replaced),
    [0, 0],
    'no call trapped',
  );
  assert.ok(checkpointed >= 5 && storedCheckpoints > 0, `${checkpointed} checkpoints saved, ${storedCheckpoints} seen stored`);
});

test('fingerprints agree through both bindings', async () => {
  const rng = random(18);
  const int = (n) => Math.floor(rng() * n);
  const [lean, jco] = [undefined, await jcoGuest()].map((guest) => Guard.load({ guest, renewLease: false }));
  for (let i = 0; i < 50; i++) {
    const headers = Array.from({ length: int(5) }, () => [['a', 'B', 'ü', ''][int(4)], Uint8Array.from({ length: int(5) }, () => int(256))]);
    const request = {
      method: ['get', 'POST', 'ß'][int(3)],
      path: `/p?${['', 'q=1', '日'][int(3)]}`,
      headers,
      body: Uint8Array.from({ length: int(30) }, () => int(256)),
    };
    assert.equal(lean.fingerprint(request), jco.fingerprint(request));
  }
});

test('a component whose core signatures moved is refused at load', () => {
  const bytes = readFileSync(component);
  const get = IMPORTS['store/get'];
  // As if `get` had gained a parameter: the WIT mirror's no longer matches the guest's.
  IMPORTS['store/get'] = { params: [...get.params.slice(0, -1), 'i32', 'i32'], results: get.results };
  try {
    assert.throws(
      () => new Guest(bytes),
      (e) => e instanceof AbiViolation && e.message.startsWith('store/get: core signature'),
    );
  } finally {
    IMPORTS['store/get'] = get;
  }
  assert.throws(() => new Guest(Uint8Array.of(0, 0x61, 0x73, 0x6d, 1, 0, 0, 0)), /not a component/);
  assert.ok(new Guest(bytes).module, 'the real component loads');
  assert.equal(Object.keys(EXPORTS).length, 7);
});

test('the 0.3 guest imports what the binding lowers and no more: not the response constructor, headers, body, nor store.delete', () => {
  const imported = new Guest(readFileSync(component)).imports.map(([iface, name]) => `${iface}/${name}`).sort();
  assert.deepEqual(imported, Object.keys(IMPORTS).sort());
  for (const unused of ['types/[constructor]response', 'types/[method]response.headers', 'types/[method]response.body', 'store/delete']) {
    assert.ok(!imported.includes(unused), unused);
  }
  // A `result<bool, store-error>` comes back through a pointer, as the guest's core signature says (checked at load).
  assert.deepEqual(IMPORTS['store/replace'].results, []);
});

test('the layouts are the canonical ABI’s', () => {
  // Offsets jco 1.35 generates for the same WIT (gen/idem.js reads a claim from begin's result at
  // +16..+88, writes complete's parameters into 104 bytes: the claim at 0, the response's handle at
  // 72, the policy at 80; and reads replace's `option<borrow<response>>` at +80, its handle at +84).
  assert.equal(BEGIN_RESULT.payload + DECISION.payload, 16);
  assert.deepEqual(CLAIM.offset, { key: 0, fingerprint: 8, fence: 16, holder: 24, leaseUntilMs: 32, expiresAtMs: 40, checkpoint: 48 });
  assert.deepEqual([RECORD.size, ENTRY.size, INSERT_RESULT.size, GET_RESULT.size], [64, 80, 96, 96]);
  assert.deepEqual(ENTRY.offset, { record: 0, response: 64, version: 72 });
  assert.deepEqual([PARAMS.complete.size, PARAMS.complete.offset], [104, { 0: 0, 1: 72, 2: 80 }]);
  assert.deepEqual(PARAMS['store/replace'].offset, { 0: 0, 1: 8, 2: 16, 3: 80, 4: 88 });
  // A handle is one i32: the record (its response gone) flattens to 11 values, so `insert` takes them flat.
  assert.equal(RECORD.flat.length, 11);
  assert.equal(IMPORTS['store/insert'].params.length, 15, 'key, record, now, and the pointer for the result');
  assert.deepEqual([IMPORTS['store/replace'].params, EXPORTS.complete.params, EXPORTS.renew.params.length], [['i32', 'i32'], ['i32'], 16]);
  assert.deepEqual(IMPORTS['types/[method]response.same-as'], { params: ['i32', 'i32'], results: ['i32'] });
  assert.deepEqual(IMPORTS['types/[method]response.size'], { params: ['i32'], results: ['i64'] });
  assert.deepEqual(IMPORTS['types/[resource-drop]response'], { params: ['i32'], results: [] });
});

test('a response larger than the guest’s memory grows it and replays byte for byte', () => {
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000), maxResponseBytes: 8 << 20, renewLease: false });
  const body = Uint8Array.from({ length: 3 << 20 }, (_, i) => (i * 7) & 0xff); // past the 1.1 MB the guest starts with
  const headers = [['x-big', body.subarray(0, 70_000)]];
  const claim = guard.begin('big', 'fp').val;
  guard.complete(claim, { status: 200, headers, body });
  const replay = guard.begin('big', 'fp');
  assert.equal(replay.tag, 'replay');
  assert.ok(Buffer.from(replay.val.body).equals(body) && Buffer.from(replay.val.headers[0][1]).equals(headers[0][1]));
  assert.equal(guard.replaced, 0);
});

test('values out of their WIT range fail closed instead of wrapping', () => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock: new ManualClock(1_000), renewLease: false });
  const claim = guard.begin('k', 'fp').val;
  // 65_736 would be 200 cut to a u16; -1n would be u64::MAX as an i64.
  assert.throws(
    () => guard.complete(claim, { status: 65_536 + 200, body: 'x' }),
    (e) => e instanceof GuardError && e.kind === 'unavailable',
  );
  assert.throws(
    () => guard.complete({ ...claim, fence: -1n }, { status: 200, body: 'x' }),
    (e) => e instanceof GuardError && e.kind === 'unavailable',
  );
  assert.throws(
    () => guard.begin(42, 'fp'),
    (e) => e instanceof GuardError && e.kind === 'unavailable',
  );
  assert.equal(store.peek('k', 1_000).record.state, 'processing', 'nothing was stored');
});

// The response as a resource: the guest holds handles to host responses, never their bytes.

const policy = { leaseMs: 1_000n, retentionMs: 60_000n, maxResponseBytes: 1 << 20 };
const clock = { nowMs: () => 5_000n };
const holders = { randomU64: () => 42n };

/** A stored response of awkward bytes: headers in a set order, a non-ASCII name, a value that is not UTF-8. */
const awkward = () => ({
  status: 299,
  headers: [
    ['set-cookie', Uint8Array.of(0x61, 0x3d, 0x31)],
    ['x-ü', Uint8Array.of(0xff, 0x00, 0xfe)],
    ['set-cookie', Uint8Array.of(0x62, 0x3d, 0x32)],
  ],
  body: Uint8Array.from({ length: 300 }, (_, i) => (i * 31) & 0xff),
});

test('a replay hands back the very response the store read, and complete lends the store the very response given', () => {
  const stored = awkward();
  const seen = [];
  const store = {
    get: () => assert.fail('no read'),
    insert: (key, record) => {
      assert.equal(record.response, undefined, 'an inserted record holds no response');
      const done = { fingerprint: 'fp', state: 'done', holder: 7n, leaseUntilMs: 0n, expiresAtMs: 60_000n, response: stored, checkpoint: undefined };
      return key === 'done' ? { tag: 'existing', val: { record: done, version: 3n } } : { tag: 'inserted', val: 1n };
    },
    replace: (key, version, record) => {
      seen.push(record.response);
      return true;
    },
  };
  const instance = Guest.load(component).instantiate(store, clock, holders);
  const replay = instance.begin('done', 'fp', policy);
  assert.equal(replay.tag, 'replay');
  assert.equal(replay.val, stored, 'the store’s own object: not copied through the guest');
  const claim = instance.begin('new', 'fp', policy).val;
  const response = awkward();
  assert.equal(instance.complete(claim, response, policy), undefined);
  assert.deepEqual(seen, [response]);
  assert.equal(seen[0], response);
  assert.equal(instance.handles, 0);
});

test('replace answers whether it wrote (contract 0.3): a store that returns the new version, as 0.2 stores did, is a host bug and traps', () => {
  for (const [answer, shown] of [
    [2n, '2n'],
    [undefined, 'undefined'],
    [1, '1'],
  ]) {
    const store = { get: () => undefined, insert: () => ({ tag: 'inserted', val: 1n }), replace: () => answer };
    const instance = Guest.load(component).instantiate(store, clock, holders);
    const claim = instance.begin('k', 'fp', policy).val;
    assert.throws(
      () => instance.complete(claim, awkward(), policy),
      (e) =>
        e instanceof TypeError &&
        e.message === `replace returned ${shown}; since contract 0.3 a store's replace returns true (written at expected + 1) or false`,
    );
    assert.equal(instance.handles, 0);
  }
  // false: not written, so the guard reads the record back and finds it is not its own: stale.
  const refused = { get: () => undefined, insert: () => ({ tag: 'inserted', val: 1n }), replace: () => false };
  const instance = Guest.load(component).instantiate(refused, clock, holders);
  const claim = instance.begin('k', 'fp', policy).val;
  assert.equal(instance.complete(claim, awkward(), policy).kind, 'stale-claim');
});

test('complete’s response is stored byte for byte and replayed so; a replay is the caller’s own copy', async () => {
  for (const guest of [undefined, await jcoGuest()]) {
    const store = new MemoryStore();
    const guard = Guard.load({ store, clock: new ManualClock(1_000), renewLease: false, guest });
    const response = awkward();
    guard.complete(guard.begin('k', 'fp').val, response);
    const stored = store.peek('k', 1_000).record.response;
    assert.deepEqual(stored, awkward());
    assert.notEqual(stored.body, response.body, 'the store keeps bytes of its own');
    const first = guard.begin('k', 'fp').val;
    assert.deepEqual(first, awkward());
    first.body[0] ^= 0xff;
    first.headers[1][1][0] = 0;
    assert.deepEqual(guard.begin('k', 'fp').val, awkward(), 'changing a replay changes nothing stored');
  }
});

/** A MemoryStore whose `replace` applies `change(response)` instead of the response, then loses the reply. */
class Garbling extends MemoryStore {
  constructor(change) {
    super();
    this.change = change;
  }
  replace(key, version, record, nowMs) {
    if (!record.response) return super.replace(key, version, record, nowMs);
    super.replace(key, version, { ...record, response: this.change(record.response) }, nowMs);
    throw new StoreError('unavailable', 'reply lost');
  }
}

test('a lost reply to complete is read back and compared with same-as', async () => {
  const changes = {
    'the same bytes, other arrays': (r) => ({ status: r.status, headers: r.headers.map(([n, v]) => [n, v.slice()]), body: r.body.slice() }),
    'another status': (r) => ({ ...r, status: r.status + 1 }),
    'headers in another order': (r) => ({ ...r, headers: [...r.headers].reverse() }),
    'a header name in another case': (r) => ({ ...r, headers: r.headers.map(([n, v], i) => [i === 0 ? n.toUpperCase() : n, v]) }),
    'a header value byte changed': (r) => ({ ...r, headers: r.headers.map(([n, v], i) => [n, i === 1 ? Uint8Array.of(0xff, 0x00, 0xff) : v]) }),
    'a header fewer': (r) => ({ ...r, headers: r.headers.slice(1) }),
    'a body byte changed': (r) => ({ ...r, body: Uint8Array.from(r.body, (b, i) => (i === 299 ? b ^ 1 : b)) }),
  };
  for (const guest of [undefined, await jcoGuest()]) {
    for (const [what, change] of Object.entries(changes)) {
      const guard = Guard.load({ store: new Garbling(change), clock: new ManualClock(1_000), renewLease: false, guest });
      const claim = guard.begin('k', 'fp').val;
      const result = outcome(() => guard.complete(claim, awkward()));
      const same = what === 'the same bytes, other arrays';
      // Read back as stored, the completion succeeds with the expiry of the record it read (1 000 + a day).
      assert.deepEqual(result.slice(0, 2), same ? ['ok', 86_401_000n] : ['error', 'stale-claim'], `${guest ? 'jco' : 'abi'}: ${what}`);
      assert.equal(guard.replaced, 0);
    }
  }
});

test('no response handle is left after a call: replayed, stored, a store error, a trap, a bad stored response', () => {
  const memory = new Corrupting();
  const instance = Guest.load(component).instantiate(memory, clock, holders);
  const claim = instance.begin('k', 'fp', policy).val;
  assert.equal(instance.handles, 0);
  // A lost reply read back (two handles: the response given, the one read), then a replay.
  memory.fault('replace', { kind: 'lost', count: 1 });
  assert.equal(instance.complete(claim, awkward(), policy), undefined);
  assert.equal(instance.handles, 0);
  assert.equal(instance.begin('k', 'fp', policy).tag, 'replay');
  assert.equal(instance.begin('k', 'other', policy).tag, 'conflict', 'a stored response read, then dropped');
  assert.equal(instance.handles, 0);
  // A store error, and a stale claim: the guest drops the response it was given.
  const second = instance.begin('k2', 'fp', policy).val;
  memory.fault('replace', { kind: 'error', count: 1 });
  assert.equal(instance.complete(second, awkward(), policy).kind, 'unavailable');
  assert.equal(instance.complete({ ...second, fence: 9n, holder: 43n }, awkward(), policy).kind, 'stale-claim');
  assert.equal(instance.handles, 0);
  // A trap while the guest holds complete's handle.
  memory.fault('replace', { kind: 'trap', count: 1 });
  assert.throws(() => instance.complete(second, awkward(), policy), /host bug injected on replace/);
  assert.equal(instance.handles, 0);

  // A store that reads back a response of the wrong shape traps as it is handed to the guest.
  const bad = Guest.load(component).instantiate(
    {
      get: () => undefined,
      insert: () => ({
        tag: 'existing',
        val: {
          record: { fingerprint: 'fp', state: 'done', holder: 1n, leaseUntilMs: 0n, expiresAtMs: 9_000n, response: { status: 200, headers: [], body: 'text' } },
          version: 2n,
        },
      }),
      replace: () => false,
    },
    clock,
    holders,
  );
  assert.throws(
    () => bad.begin('k', 'fp', policy),
    (e) => e instanceof TypeError && /the body as a Uint8Array/.test(e.message),
  );
  assert.equal(bad.handles, 0);
  // And a response given to complete that is not one never reaches the guest.
  assert.throws(() => instance.complete(second, { status: 200, headers: [['x', 'y']], body: new Uint8Array() }, policy), /a header value as a Uint8Array/);
  assert.throws(() => instance.complete(second, { status: 200, headers: [['\ud800', new Uint8Array()]], body: new Uint8Array() }, policy), /lone surrogate/);
  assert.equal(instance.handles, 0);
});
