// @idem/guard/dynamodb: the store primitives of wit/store.wit on DynamoDB,
// in the on-store layout every idem host shares (wit/store-layout/README.md,
// "DynamoDB"): one item per key in a table (default `idem_records`) that
// `idem serve` and the Python package read and write too.
//
//   import { Guard } from '@idem/guard';
//   import { DynamoDbStore } from '@idem/guard/dynamodb';
//
//   const store = await DynamoDbStore.open({ table: 'idem_records', region: 'eu-west-1' });
//   const guard = Guard.load({ store });          // asynchronous: begin/complete/... return Promises
//   const outcome = await guard.run('order-1', 'sku=A&qty=1', async () => ({ status: 201, body: 'ok' }));
//   await store.close();
//
// Each primitive is one conditional request, so one round trip: a claim is
// an UpdateItem whose failed condition answers the live item
// (ReturnValuesOnConditionCheckFailure ALL_OLD). The client is the AWS SDK's
// (`@aws-sdk/client-dynamodb`), without retries: a write whose answer was
// lost may have been applied, and the guard decides what follows.
//
// The guard's clock is the store's (`store.clock`, wit/clock.wit): AWS's
// clock as the `Date` header of DynamoDB's responses states it, in whole
// seconds, read at open and every `clockSyncMs` (1 s) after: a reading is
// the middle of its second, so its error bound is half a second plus half
// the round trip, and leases must be far longer than that.

import {
  CreateTableCommand,
  DeleteItemCommand,
  DescribeTableCommand,
  DescribeTimeToLiveCommand,
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  ScanCommand,
  UpdateItemCommand,
  UpdateTimeToLiveCommand,
} from '@aws-sdk/client-dynamodb';
import { checkedSyncMs, SYNC_EVERY_MS, startSyncing } from './clock.js';
import { StoreError } from './index.js';
import { checkedTimeoutMs, ServerStore } from './server-store.js';

const NAME = 'dynamodb';
const TABLE = /^[a-zA-Z0-9_.-]{3,255}$/;
const U64_MAX = 2n ** 64n - 1n;
/** DynamoDB deletes an item by its TTL this long after the record expired (s). */
const TTL_GRACE_S = 60n;
/** The key the clock reads: no idem key holds a control character. */
const CLOCK_KEY = '\u0001clock';
/** The attributes a record may lack (no response, no checkpoint), which a claim over an expired item removes. */
const OPTIONAL = ['status', 'header_names', 'header_values', 'body', 'phase', 'checkpoint'];

function corrupt(key, reason) {
  return new StoreError('corrupt', `${NAME} store: the record for key ${JSON.stringify(key)} does not decode: ${reason}`);
}

function unavailable(reason) {
  return new StoreError('unavailable', `${NAME} store: ${reason}`);
}

const n = (v) => ({ N: String(v) });

/** The TTL attribute for a record expiring at `expiresAtMs`: seconds, rounded up, plus the grace. */
export const ttlSeconds = (expiresAtMs) => (expiresAtMs + 999n) / 1000n + TTL_GRACE_S;

/** The record's attributes, without `key` and `version`, in the layout's DynamoDB form. */
export function recordAttributes(record) {
  const item = {
    fingerprint: { S: record.fingerprint },
    state: { S: record.state },
    lease_until_ms: n(record.leaseUntilMs),
    expires_at_ms: n(record.expiresAtMs),
    ttl: n(ttlSeconds(record.expiresAtMs)),
    holder: n(record.holder ?? 0n),
  };
  const r = record.response;
  if (r) {
    item.status = n(r.status);
    item.header_names = { L: r.headers.map(([name]) => ({ S: name })) };
    item.header_values = { L: r.headers.map(([, value]) => ({ B: value })) };
    item.body = { B: r.body };
  }
  const c = record.checkpoint;
  if (c) {
    item.phase = { S: c.phase };
    item.checkpoint = { B: c.data };
  }
  return item;
}

/** The whole item for `record` at `version` under `key`. */
export function encodeItem(key, version, record) {
  return { key: { S: key }, version: n(version), ...recordAttributes(record) };
}

function number(item, name) {
  const v = item[name];
  if (v === undefined) throw new Error(`${name} is missing`);
  if (typeof v.N !== 'string') throw new Error(`${name} is not a number`);
  if (!/^[0-9]+$/.test(v.N) || BigInt(v.N) > U64_MAX) throw new Error(`${name} ${v.N} is not a whole number from 0 to 2^64 - 1`);
  return BigInt(v.N);
}

function string(item, name) {
  const v = item[name];
  if (v === undefined) throw new Error(`${name} is missing`);
  if (typeof v.S !== 'string') throw new Error(`${name} is not a string`);
  return v.S;
}

function binary(v, name) {
  if (!(v?.B instanceof Uint8Array)) throw new Error(`${name} is not binary`);
  return v.B;
}

/** The entry an item holds, whatever its expiry; a corrupt StoreError naming `key` when it does not decode. */
export function decodeItem(key, item) {
  try {
    const state = string(item, 'state');
    if (state !== 'processing' && state !== 'done') throw new Error(`state ${JSON.stringify(state)} is not processing or done`);
    const record = {
      fingerprint: string(item, 'fingerprint'),
      state,
      holder: number(item, 'holder'),
      leaseUntilMs: number(item, 'lease_until_ms'),
      expiresAtMs: number(item, 'expires_at_ms'),
    };
    const present = ['status', 'header_names', 'header_values', 'body'].filter((a) => item[a] !== undefined).length;
    if (present === 4) {
      const status = number(item, 'status');
      if (status > 0xffffn) throw new Error(`status ${status} is past 65535`);
      const names = item.header_names.L;
      const values = item.header_values.L;
      if (!Array.isArray(names)) throw new Error('header_names is not a list');
      if (!Array.isArray(values)) throw new Error('header_values is not a list');
      if (names.length !== values.length) throw new Error(`${names.length} header names but ${values.length} header values`);
      const headers = names.map((name, i) => {
        if (typeof name.S !== 'string') throw new Error('a header name is not a string');
        return [name.S, binary(values[i], 'header_values')];
      });
      record.response = { status: Number(status), headers, body: binary(item.body, 'body') };
    } else if (present !== 0) {
      throw new Error("the response's status, header_names, header_values and body are only partly present");
    }
    if (item.phase !== undefined && item.checkpoint !== undefined) {
      record.checkpoint = { phase: string(item, 'phase'), data: binary(item.checkpoint, 'checkpoint') };
    } else if (item.phase !== undefined || item.checkpoint !== undefined) {
      throw new Error("the checkpoint's phase and data are only partly present");
    }
    return { record, version: number(item, 'version') };
  } catch (e) {
    throw corrupt(key, e.message);
  }
}

/** An HTTP `Date` in milliseconds since the epoch: its second's start. */
export function dateMs(date) {
  const ms = Date.parse(date);
  if (!Number.isFinite(ms) || ms < 0) throw new Error(`the Date header ${JSON.stringify(date)} does not parse`);
  return ms;
}

/** `#name` for each name: several of the layout's are DynamoDB reserved words. */
const names = (list) => Object.fromEntries(list.map((name) => [`#${name}`, name]));

const failedCondition = (e) => e?.name === 'ConditionalCheckFailedException';

/**
 * The store primitives on a DynamoDB table, asynchronous (`async: true`): a
 * `Guard` over it replays each call from a journal and returns Promises. Its
 * clock is AWS's, from the Date header of DynamoDB's responses, kept synced
 * while the store is open; its timeout bounds a request.
 */
export class DynamoDbStore extends ServerStore {
  #client;
  #table;

  /**
   * Creates the table if it is absent (on-demand, partition key `key`, TTL
   * on `ttl`) and reads the clock. Fails when the endpoint cannot be reached
   * now; after that, each operation fails as unavailable while it cannot.
   *
   * @param {object} options
   * @param {string} options.endpoint  a DynamoDB-compatible server (`http://127.0.0.1:8000`) or another endpoint; default AWS's for the region
   * @param {string} options.region    the region (default: the SDK's chain; `us-east-1` for an `http:` endpoint)
   * @param {string} options.table     the table (default `idem_records`): 3 to 255 of a-z, A-Z, 0-9, _, - and .
   * @param {number} options.timeoutMs how long a request may take before it fails as unavailable (default 2 000)
   * @param {number} options.clockSyncMs how often the clock is read again (default 1 000; 100 to 3 600 000)
   * @param {object} options.credentials the SDK's credentials (default: its chain; dummy ones for an `http:` endpoint without AWS_* variables)
   */
  static async open({ endpoint, region, table = 'idem_records', timeoutMs = 2_000, clockSyncMs = SYNC_EVERY_MS, credentials } = {}) {
    if (typeof table !== 'string' || !TABLE.test(table)) {
      throw new RangeError(`table=${JSON.stringify(table)} must be 3 to 255 characters of a-z, A-Z, 0-9, _, - and .`);
    }
    checkedTimeoutMs(timeoutMs);
    checkedSyncMs(clockSyncMs);
    const local = typeof endpoint === 'string' && endpoint.startsWith('http:');
    const config = { maxAttempts: 1 };
    if (endpoint !== undefined) config.endpoint = endpoint;
    if (region !== undefined) config.region = region;
    else if (local) config.region = 'us-east-1';
    if (credentials !== undefined) config.credentials = credentials;
    else if (local && !process.env.AWS_ACCESS_KEY_ID) config.credentials = { accessKeyId: 'idem', secretAccessKey: 'idem' };
    const client = new DynamoDBClient(config);
    const store = new DynamoDbStore(client, table, timeoutMs);
    try {
      await store.#ensureTable();
      await startSyncing(store.clock, clockSyncMs, () => store.#serverTime());
      return store;
    } catch (e) {
      client.destroy();
      throw new Error(`${NAME} store: cannot open the table ${JSON.stringify(table)} at ${endpoint ?? "AWS's endpoint"}: ${e?.message ?? e}`);
    }
  }

  constructor(client, table, timeoutMs) {
    super("AWS's clock, from the Date header of DynamoDB's responses (whole seconds)", timeoutMs, { resolutionMs: 1_000 });
    this.#client = client;
    this.#table = table;
  }

  /** The table the records are in. */
  get table() {
    return this.#table;
  }

  /** Stops reading the clock and closes the client's connections. */
  async close() {
    this.clock.stop();
    this.#client.destroy();
  }

  /** Sends `command` within the timeout; rejects with what the SDK said. */
  async #send(command) {
    return this.#client.send(command, { abortSignal: AbortSignal.timeout(this.timeoutMs) });
  }

  /** `command`, whose failed condition resolves to `undefined`; other failures are unavailable. */
  async #conditional(command) {
    try {
      return await this.#send(command);
    } catch (e) {
      if (failedCondition(e)) return undefined;
      throw unavailable(describe(e, this.timeoutMs));
    }
  }

  async #ensureTable() {
    const table = this.#table;
    try {
      const { Table } = await this.#send(new DescribeTableCommand({ TableName: table }));
      const schema = Table?.KeySchema ?? [];
      if (schema.length !== 1 || schema[0].AttributeName !== 'key') {
        throw new Error(
          `the table ${JSON.stringify(table)} exists with another key; idem needs a table whose partition key is the string "key" and nothing else`,
        );
      }
    } catch (e) {
      if (e?.name !== 'ResourceNotFoundException') throw e;
      try {
        await this.#send(
          new CreateTableCommand({
            TableName: table,
            AttributeDefinitions: [{ AttributeName: 'key', AttributeType: 'S' }],
            KeySchema: [{ AttributeName: 'key', KeyType: 'HASH' }],
            BillingMode: 'PAY_PER_REQUEST',
          }),
        );
      } catch (created) {
        if (created?.name !== 'ResourceInUseException') throw created; // another host created it first
      }
    }
    // A table just created is CREATING for a few seconds on AWS.
    for (let wait = 100; ; wait = Math.min(wait * 2, 2_000)) {
      const { Table } = await this.#send(new DescribeTableCommand({ TableName: table }));
      if (Table?.TableStatus === 'ACTIVE') break;
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
    const { TimeToLiveDescription: ttl } = await this.#send(new DescribeTimeToLiveCommand({ TableName: table }));
    const on = ttl?.TimeToLiveStatus === 'ENABLED' || ttl?.TimeToLiveStatus === 'ENABLING';
    if (on && ttl.AttributeName === 'ttl') return;
    if (on) throw new Error(`the table ${JSON.stringify(table)} has its TTL on ${JSON.stringify(ttl.AttributeName)}; idem's records expire by "ttl"`);
    await this.#send(new UpdateTimeToLiveCommand({ TableName: table, TimeToLiveSpecification: { Enabled: true, AttributeName: 'ttl' } }));
  }

  /** AWS's time as a DynamoDB response dates it (whole seconds): an eventually consistent read of the clock key. */
  async #serverTime() {
    const command = new GetItemCommand({
      TableName: this.#table,
      Key: { key: { S: CLOCK_KEY } },
      ProjectionExpression: '#key',
      ExpressionAttributeNames: { '#key': 'key' },
    });
    let date;
    command.middlewareStack.add(
      (next) => async (args) => {
        const result = await next(args);
        date = result.response?.headers?.date;
        return result;
      },
      { step: 'deserialize', name: 'idemDateHeader' },
    );
    await this.#send(command);
    if (typeof date !== 'string') throw new Error('the response has no Date header');
    return dateMs(date);
  }

  async get(key, nowMs) {
    let out;
    try {
      out = await this.#send(new GetItemCommand({ TableName: this.#table, Key: { key: { S: key } }, ConsistentRead: true }));
    } catch (e) {
      throw unavailable(describe(e, this.timeoutMs));
    }
    if (!out.Item) return undefined;
    const entry = decodeItem(key, out.Item);
    return entry.record.expiresAtMs > BigInt(nowMs) ? entry : undefined;
  }

  async insert(key, record, nowMs) {
    const attributes = recordAttributes(record);
    const set = ['#version = if_not_exists(#version, :zero) + :one'];
    const remove = [];
    const values = { ':zero': n(0), ':one': n(1), ':now': n(nowMs) };
    const named = ['key', 'version', 'expires_at_ms'];
    for (const name of ['fingerprint', 'state', 'lease_until_ms', 'expires_at_ms', 'ttl', 'holder', ...OPTIONAL]) {
      if (!named.includes(name)) named.push(name);
      if (attributes[name] === undefined) remove.push(`#${name}`);
      else {
        set.push(`#${name} = :${name}`);
        values[`:${name}`] = attributes[name];
      }
    }
    const update = `SET ${set.join(', ')}${remove.length ? ` REMOVE ${remove.join(', ')}` : ''}`;
    try {
      const out = await this.#send(
        new UpdateItemCommand({
          TableName: this.#table,
          Key: { key: { S: key } },
          UpdateExpression: update,
          ConditionExpression: 'attribute_not_exists(#key) OR #expires_at_ms <= :now',
          ExpressionAttributeNames: names(named),
          ExpressionAttributeValues: values,
          ReturnValues: 'UPDATED_NEW',
          ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
        }),
      );
      try {
        return { tag: 'inserted', val: number(out.Attributes ?? {}, 'version') };
      } catch (e) {
        throw unavailable(`the claim's answer: ${e.message}`);
      }
    } catch (e) {
      if (e instanceof StoreError) throw e;
      if (!failedCondition(e)) throw unavailable(describe(e, this.timeoutMs));
      if (!e.Item) throw unavailable("the claim's condition failed but DynamoDB returned no item (ReturnValuesOnConditionCheckFailure unsupported?)");
      const entry = decodeItem(key, e.Item);
      // Only an attribute of another type fails the condition so.
      if (entry.record.expiresAtMs <= BigInt(nowMs)) throw corrupt(key, 'its expires_at_ms is not a number DynamoDB compares');
      return { tag: 'existing', val: entry };
    }
  }

  /** Writes the record at `expectedVersion + 1` if the item live at `nowMs` is at `expectedVersion`: whether it did. */
  async replace(key, expectedVersion, record, nowMs) {
    if (expectedVersion >= U64_MAX) return false; // its successor is no u64: refused, not an error
    const out = await this.#conditional(
      new PutItemCommand({
        TableName: this.#table,
        Item: encodeItem(key, expectedVersion + 1n, record),
        ConditionExpression: '#version = :expected AND #expires_at_ms > :now',
        ExpressionAttributeNames: names(['version', 'expires_at_ms']),
        ExpressionAttributeValues: { ':expected': n(expectedVersion), ':now': n(nowMs) },
      }),
    );
    return out !== undefined;
  }

  /**
   * Removes the item live at `nowMs` (default: now by the store's clock),
   * only at `expectedVersion` when given: whether it did. An expired item is
   * left alone (false); DynamoDB's TTL frees it.
   */
  async delete(key, expectedVersion, nowMs = this.clock.nowMs()) {
    const at = expectedVersion !== undefined;
    const out = await this.#conditional(
      new DeleteItemCommand({
        TableName: this.#table,
        Key: { key: { S: key } },
        ConditionExpression: `#expires_at_ms > :now${at ? ' AND #version = :expected' : ''}`,
        ExpressionAttributeNames: names(at ? ['expires_at_ms', 'version'] : ['expires_at_ms']),
        ExpressionAttributeValues: at ? { ':now': n(nowMs), ':expected': n(expectedVersion) } : { ':now': n(nowMs) },
      }),
    );
    return out !== undefined;
  }

  /**
   * Deletes at most `limit` items expired at `nowMs` (a scan, then a
   * conditional delete of each that is still the expired one seen); resolves
   * to how many. DynamoDB's TTL frees them too: for operators who want it now.
   */
  async purgeExpired(nowMs, limit) {
    if (!(Number.isInteger(limit) && limit > 0)) throw new RangeError(`limit ${limit} must be a positive whole number`);
    const expired = [];
    let start;
    do {
      let page;
      try {
        page = await this.#send(
          new ScanCommand({
            TableName: this.#table,
            ConsistentRead: true,
            FilterExpression: '#expires_at_ms <= :now',
            ExpressionAttributeNames: names(['expires_at_ms']),
            ExpressionAttributeValues: { ':now': n(nowMs) },
            ExclusiveStartKey: start,
          }),
        );
      } catch (e) {
        throw unavailable(describe(e, this.timeoutMs));
      }
      expired.push(...(page.Items ?? []));
      start = page.LastEvaluatedKey;
    } while (start !== undefined && expired.length < limit);
    let purged = 0;
    for (const item of expired.slice(0, limit)) {
      if (typeof item.key?.S !== 'string' || typeof item.version?.N !== 'string') continue; // not a record of this layout
      const out = await this.#conditional(
        new DeleteItemCommand({
          TableName: this.#table,
          Key: { key: item.key },
          ConditionExpression: '#version = :expected AND #expires_at_ms <= :now',
          ExpressionAttributeNames: names(['version', 'expires_at_ms']),
          ExpressionAttributeValues: { ':expected': item.version, ':now': n(nowMs) },
        }),
      );
      if (out !== undefined) purged += 1;
    }
    return purged;
  }
}

/** What the SDK said, or that the request timed out. */
function describe(e, timeoutMs) {
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError') return `no answer within ${timeoutMs} ms`;
  return e?.name && e?.message ? `${e.name}: ${e.message}` : String(e?.message ?? e);
}
