// What the tests on Redis and PostgreSQL share: the servers' URLs, stores
// under names of this run's own, cleaning up after them, and fault injection
// in front of an asynchronous store. Not part of the package (not in
// package.json `files`), and outside test/ so `node --test test/` does not
// run it as a test file.
//
// The servers come from IDEM_TEST_REDIS_URL, IDEM_TEST_VALKEY_URL (Valkey
// 8.1+, for SET … IFEQ), IDEM_TEST_POSTGRES_URL and IDEM_TEST_DYNAMODB_URL
// (a DynamoDB-compatible server; CI sets them all:
// scripts/test-all.sh, examples/run-polyglot-tests.sh). A test
// that needs one FAILS when it is not set, so CI can never pass by silently
// skipping them; IDEM_TEST_SKIP_NETSTORES=1 skips them instead, saying so.

import { DeleteTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDbStore } from '../dynamodb.js';
import { StoreError } from '../index.js';
import { PostgresStore } from '../postgres.js';
import { RedisStore } from '../redis.js';

const SKIP = process.env.IDEM_TEST_SKIP_NETSTORES === '1';

/** `node:test`'s `skip` option for a test that needs the server of env var `name`. */
export function skipWithout(name) {
  return !process.env[name] && SKIP ? `${name} is not set and IDEM_TEST_SKIP_NETSTORES=1` : false;
}

/** The server's URL; throws (failing the test) when it is not set. */
export function serverUrl(name) {
  const url = process.env[name];
  if (url) return url;
  throw new Error(
    `${name} is not set (CI sets it; e.g. IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379, IDEM_TEST_VALKEY_URL=redis://127.0.0.1:6391, IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test); ` +
      'set IDEM_TEST_SKIP_NETSTORES=1 to skip the Redis and PostgreSQL tests',
  );
}

let next = 0;
/** A name of this run's own: `idemjs_<pid>_<n>`. */
export const unique = () => `idemjs_${process.pid}_${next++}`;

/**
 * A RedisStore under a prefix of its own on the server of env var `env`
 * (IDEM_TEST_VALKEY_URL for Valkey); `store.cleanUp()` deletes its keys and
 * closes it.
 */
export async function redisStore(options = {}, env = 'IDEM_TEST_REDIS_URL') {
  const url = serverUrl(env);
  const prefix = `${unique()}:`;
  const store = await RedisStore.open({ url, prefix, ...options });
  const { Redis } = await import('ioredis');
  store.cleanUp = async () => {
    const admin = new Redis(url);
    try {
      let cursor = '0';
      do {
        const [at, keys] = await admin.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
        if (keys.length) await admin.del(...keys);
        cursor = at;
      } while (cursor !== '0');
    } finally {
      admin.disconnect();
      await store.close();
    }
  };
  return store;
}

/** A PostgresStore on a table of its own; `store.cleanUp()` drops it (and its functions and schema row) and closes it. */
export async function postgresStore(options = {}) {
  const url = serverUrl('IDEM_TEST_POSTGRES_URL');
  const table = unique();
  const store = await PostgresStore.open({ url, table, ...options });
  store.cleanUp = async () => {
    await store.close();
    await dropTable(url, table);
  };
  store.sql = (text, values) => sql(url, text, values);
  return store;
}

/**
 * IDEM_TEST_DYNAMODB_URL (`dynamodb://HOST:PORT?table=T&region=R`, the Rust
 * store's form: a DynamoDB-compatible server over plain HTTP) as the
 * options of DynamoDbStore.open.
 */
export function dynamodbOptions() {
  const url = new URL(serverUrl('IDEM_TEST_DYNAMODB_URL'));
  return {
    endpoint: `http://${url.host}`,
    region: url.searchParams.get('region') ?? 'us-east-1',
    table: url.searchParams.get('table') ?? 'idem_records',
  };
}

/** A DynamoDbStore on a table of its own; `store.cleanUp()` closes it and deletes the table. `store.raw` is an SDK client on the server. */
export async function dynamodbStore(options = {}) {
  const { endpoint, region } = dynamodbOptions();
  const table = unique();
  const store = await DynamoDbStore.open({ endpoint, region, table, ...options });
  store.raw = new DynamoDBClient({ endpoint, region, credentials: { accessKeyId: 'idem', secretAccessKey: 'idem' } });
  store.cleanUp = async () => {
    await store.close();
    await store.raw.send(new DeleteTableCommand({ TableName: table }));
    store.raw.destroy();
  };
  return store;
}

/** Runs one statement on a connection of its own. */
export async function sql(url, text, values = []) {
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await client.query(text, values);
  } finally {
    await client.end();
  }
}

export async function dropTable(url, table) {
  await sql(
    url,
    `DROP TABLE IF EXISTS ${table}; DROP FUNCTION IF EXISTS ${table}_try_claim; DROP FUNCTION IF EXISTS ${table}_claim; ` +
      `DELETE FROM idem_schema WHERE table_name = '${table}'`,
  );
}

/**
 * An asynchronous store in front of `inner` that fails primitives on
 * request, as MemoryStore's `fault`: `error` fails before applying, `lost`
 * applies then fails (a lost reply). `calls` lists every primitive that
 * reached it, as `op key`.
 */
export class FaultyStore {
  async = true;
  calls = [];
  #faults = new Map();

  constructor(inner) {
    this.inner = inner;
  }

  /** The inner store's time authority. */
  get clock() {
    return this.inner.clock;
  }

  fault(primitive, rule) {
    this.#faults.set(primitive, { ...rule });
  }

  clearFaults() {
    this.#faults.clear();
  }

  async #apply(op, key, args) {
    this.calls.push(`${op} ${key}`);
    const rule = this.#faults.get(op);
    if (!rule) return this.inner[op](...args);
    if (rule.count !== undefined && --rule.count <= 0) this.#faults.delete(op);
    if (rule.kind === 'error') throw new StoreError('unavailable', `${rule.message ?? 'injected fault'} (injected on ${op})`);
    if (rule.kind === 'lost') {
      await this.inner[op](...args);
      throw new StoreError('unavailable', `reply to ${op} lost (injected; the operation was applied)`);
    }
    throw new Error(`unknown fault kind ${rule.kind}`);
  }

  get(key, nowMs) {
    return this.#apply('get', key, [key, nowMs]);
  }

  insert(key, record, nowMs) {
    return this.#apply('insert', key, [key, record, nowMs]);
  }

  replace(key, expectedVersion, record, nowMs) {
    return this.#apply('replace', key, [key, expectedVersion, record, nowMs]);
  }

  delete(key, expectedVersion, nowMs) {
    return this.#apply('delete', key, [key, expectedVersion, nowMs]);
  }
}
