// DynamoDbStore (dynamodb.js): its items against the layout's vectors
// (wit/store-layout/vectors.json, `dynamodb`), the Date header as the clock,
// and live on the server IDEM_TEST_DYNAMODB_URL names (CI: moto's, started by
// scripts/services.sh): one request per primitive, TTL on every item,
// undecodable items corrupt naming the key. The conformance scenarios run
// on it in conformance.test.js.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GetItemCommand, PutItemCommand } from '@aws-sdk/client-dynamodb';
import { SyncedClock } from '../clock.js';
import { dateMs, decodeItem, encodeItem } from '../dynamodb.js';
import { Guard, StoreError } from '../index.js';
import { dynamodbStore, skipWithout } from '../testing/netstores.js';
import { record, u8, vectors } from '../testing/vectors.js';

/** An item of the vectors' DynamoDB JSON (`B` in hex) as the SDK gives it (`B` as bytes). */
function item(json) {
  const attribute = (v) => {
    if ('B' in v) return { B: u8(v.B) };
    if ('L' in v) return { L: v.L.map(attribute) };
    return v;
  };
  return Object.fromEntries(Object.entries(json).map(([name, v]) => [name, attribute(v)]));
}

const isCorrupt = (key) => (e) => e instanceof StoreError && e.payload.tag === 'corrupt' && e.payload.val.includes(JSON.stringify(key));

test('vectors: each record encodes to the layout’s DynamoDB item and decodes back', () => {
  for (const v of vectors.records) {
    const expected = { key: { S: 'k' }, ...item(v.dynamodb) };
    assert.deepEqual(encodeItem('k', BigInt(v.version), record(v.record)), expected, v.name);
    assert.deepEqual(decodeItem('k', expected), { record: record(v.record), version: BigInt(v.version) }, v.name);
  }
});

test('vectors: corrupt DynamoDB items are refused as corrupt, naming the key', () => {
  assert.ok(vectors.corrupt_dynamodb.length > 0);
  for (const v of vectors.corrupt_dynamodb) {
    assert.throws(() => decodeItem('order-9', item(v.dynamodb)), isCorrupt('order-9'), v.name);
  }
});

test('vectors: a Date header reads as its second, a reading as the middle of that second', () => {
  for (const v of vectors.time.dynamodb_date) assert.equal(dateMs(v.date), Number(v.ms), v.date);
  for (const r of vectors.time.dynamodb_readings) {
    const clock = new SyncedClock('a Date header', { resolutionMs: 1_000 });
    clock.adopt(Number(r.server_ms), Number(r.sent), Number(r.received));
    assert.equal(clock.at(Number(r.at)), Number(r.now_ms));
    assert.equal(clock.errorAt(Number(r.at)), Number(r.error_ms));
  }
});

const DYNAMODB = 'IDEM_TEST_DYNAMODB_URL';
const BASE = 1_792_382_400_000n;
const claim = (lease, expires) => ({ fingerprint: 'fp', state: 'processing', holder: 7n, leaseUntilMs: lease, expiresAtMs: expires });

test('DynamoDB: a claim, a refusal with the live record, a completion, a takeover of an expired record, a release', {
  skip: skipWithout(DYNAMODB),
}, async () => {
  const store = await dynamodbStore();
  try {
    assert.deepEqual(await store.insert('k', claim(BASE + 1_000n, BASE + 10_000n), BASE), { tag: 'inserted', val: 1n });
    const refused = await store.insert('k', claim(BASE + 1_000n, BASE + 10_000n), BASE);
    assert.equal(refused.tag, 'existing');
    assert.deepEqual(refused.val, { record: claim(BASE + 1_000n, BASE + 10_000n), version: 1n });
    const done = {
      ...claim(BASE, BASE + 10_000n),
      state: 'done',
      response: { status: 201, headers: [['x', new Uint8Array([0xff])]], body: new Uint8Array([1, 2]) },
    };
    assert.equal(await store.replace('k', 2n, done, BASE), false, 'a stale version');
    assert.equal(await store.replace('k', 1n, done, BASE), true);
    assert.deepEqual(await store.get('k', BASE), { record: done, version: 2n });
    assert.equal(await store.get('k', BASE + 10_000n), undefined, 'expired');
    // Over the expired record: its version + 1, its response gone.
    assert.deepEqual(await store.insert('k', claim(BASE + 11_000n, BASE + 20_000n), BASE + 10_000n), { tag: 'inserted', val: 3n });
    assert.deepEqual(await store.get('k', BASE + 10_000n), { record: claim(BASE + 11_000n, BASE + 20_000n), version: 3n });
    assert.equal(await store.delete('k', 2n, BASE + 10_000n), false, 'another version');
    assert.equal(await store.delete('k', 3n, BASE + 10_000n), true);
    assert.equal(await store.get('k', BASE + 10_000n), undefined);
    // The TTL attribute: the expiry in seconds, rounded up, plus a minute.
    await store.insert('t', claim(BASE + 1n, BASE + 10_001n), BASE);
    const { Item } = await store.raw.send(new GetItemCommand({ TableName: store.table, Key: { key: { S: 't' } }, ConsistentRead: true }));
    assert.deepEqual(Item.ttl, { N: String((BASE + 10_001n + 999n) / 1000n + 60n) });
  } finally {
    await store.cleanUp();
  }
});

test('DynamoDB: an undecodable item is corrupt naming the key, and the guard runs nothing', { skip: skipWithout(DYNAMODB) }, async () => {
  const store = await dynamodbStore();
  try {
    const live = String(2n ** 62n); // live by the guard's clock too (the store's: now)
    await store.raw.send(
      new PutItemCommand({
        TableName: store.table,
        Item: {
          key: { S: 'bad' },
          version: { N: '1' },
          fingerprint: { S: 'fp' },
          state: { S: 'paused' },
          lease_until_ms: { N: live },
          expires_at_ms: { N: live },
          holder: { N: '1' },
        },
      }),
    );
    await assert.rejects(store.get('bad', BASE), isCorrupt('bad'));
    await assert.rejects(store.insert('bad', claim(BASE + 1n, BASE + 10n), BASE), isCorrupt('bad'));
    let runs = 0;
    const guard = Guard.load({ store });
    const outcome = await guard.run('bad', 'fp', async () => {
      runs += 1;
      return { status: 200, body: 'no' };
    });
    assert.equal(outcome.outcome, 'unavailable');
    assert.match(outcome.message, /bad/);
    assert.equal(runs, 0);
  } finally {
    await store.cleanUp();
  }
});

test('DynamoDB: the clock is read from the Date header, known to within half a second and the round trip', { skip: skipWithout(DYNAMODB) }, async () => {
  const store = await dynamodbStore();
  try {
    const error = store.clock.errorMs();
    assert.ok(error >= 501 && error < 2_000, `${error}`);
    assert.match(store.clock.authority, /Date header/);
  } finally {
    await store.cleanUp();
  }
});
