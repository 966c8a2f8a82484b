// OpenTelemetry spans (issue #47), received over OTLP the way a collector
// receives them: the test starts an OTLP/HTTP receiver of its own
// (`POST /v1/traces`, JSON), registers the SDK's tracer provider with the
// OTLP exporter pointed at it, and reads back what a guard sent: one
// `idem.run` span per `run` with the key, decision, fence and outcome; the
// handler's own spans as its children; over an asynchronous store one child
// span per store call; a failed run's status. And before a provider is
// registered, or with `tracing: false`, no span is started at all.

import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, test } from 'node:test';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import express from 'express';
import { idempotency } from '../express.js';
import { Guard, ManualClock, MemoryStore } from '../index.js';
import { Tracing } from '../telemetry.js';
import { asyncOver } from '../testing/async-store.js';
import { redisStore, skipWithout } from '../testing/netstores.js';

/** The spans the receiver got, flattened: `{ name, traceId, spanId, parentSpanId, kind, status, attributes }`. */
const received = [];
let receiver;
let provider;

/** An OTLP attribute value as a JS value. */
function attributeValue(v) {
  if ('stringValue' in v) return v.stringValue;
  if ('boolValue' in v) return v.boolValue;
  if ('intValue' in v) return Number(v.intValue);
  if ('doubleValue' in v) return v.doubleValue;
  return v;
}

function receive(body) {
  for (const rs of body.resourceSpans ?? []) {
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        received.push({
          scope: ss.scope?.name,
          name: s.name,
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId || undefined,
          kind: s.kind,
          status: s.status?.code ?? 0,
          message: s.status?.message,
          attributes: Object.fromEntries((s.attributes ?? []).map((a) => [a.key, attributeValue(a.value)])),
        });
      }
    }
  }
}

test('with @opentelemetry/api installed but no tracer provider registered, no span is started', async () => {
  assert.equal(new Tracing(true).tracer(), null);
  // And a run works as ever.
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000) });
  assert.equal((await guard.run('k', 'fp', async () => ({ status: 200 }))).outcome, 'executed');
});

/** The receiver and the provider, started by the first test that needs them (the first test needs none). */
let ready;
const registered = () => (ready ??= register());

async function register() {
  receiver = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      assert.equal(req.url, '/v1/traces');
      assert.match(req.headers['content-type'], /application\/json/);
      receive(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${receiver.address().port}/v1/traces`;
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url }))] });
  trace.setGlobalTracerProvider(provider);
}

after(async () => {
  await provider?.shutdown();
  receiver?.close();
});

/** Everything exported so far has reached the receiver. */
const flushed = () => provider.forceFlush();

// Every test from here on runs with the provider registered.
test('the receiver starts and the provider is registered', registered);

const attrs = (span) => span.attributes;
const named = (name, key) => received.filter((s) => s.name === name && s.attributes['idem.key'] === key);

test("each run is one idem.run span, received over OTLP with its decision, fence and outcome; the handler's spans are its children", async () => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock: new ManualClock(1_000_000), leaseMs: 1_000 });
  const app = trace.getTracer('shop');
  const charge = async () =>
    app.startActiveSpan('charge card', async (span) => {
      span.end();
      return { status: 201, body: 'paid' };
    });
  await guard.run('order-1', 'fp', charge);
  await guard.run('order-1', 'fp', charge);
  await guard.run('order-1', 'other', charge);
  store.fault('insert', { kind: 'error', message: 'connection refused' });
  await guard.run('order-2', 'fp', charge);
  store.clearFaults();
  await assert.rejects(guard.run('order-3', 'fp', async () => Promise.reject(new Error('declined'))));
  await flushed();

  const runs = named('idem.run', 'order-1');
  assert.deepEqual(
    runs.map((s) => [s.attributes['idem.outcome'], s.attributes['idem.decision'], s.attributes['idem.replayed'], s.attributes['idem.fence']]),
    [
      ['executed', 'proceed', false, 1],
      ['replayed', 'replay', true, undefined],
      ['conflict', 'conflict', false, undefined],
    ],
  );
  assert.ok(runs.every((s) => s.scope === '@idem/guard' && s.kind === 1 /* INTERNAL in OTLP */ && s.status !== 2));
  // The handler's span is a child of the run that ran it (and only that run ran it).
  const charges = received.filter((s) => s.name === 'charge card');
  assert.equal(charges.length, 1);
  assert.equal(charges[0].parentSpanId, runs[0].spanId);
  assert.equal(charges[0].traceId, runs[0].traceId);

  const [down] = named('idem.run', 'order-2');
  assert.equal(attrs(down)['idem.outcome'], 'unavailable');
  assert.equal(down.status, 2 /* ERROR */);
  assert.match(down.message, /connection refused/);
  const [failed] = named('idem.run', 'order-3');
  assert.deepEqual([attrs(failed)['idem.outcome'], failed.status, failed.message], ['failed', 2, 'declined']);
});

async function storeCallsAreChildren(store, key) {
  const guard = Guard.load({ store });
  await guard.run(key, 'fp', async () => ({ status: 200, body: 'ok' }));
  await guard.run(key, 'fp', async () => ({ status: 200, body: 'ok' }));
  await flushed();
  const runs = named('idem.run', key);
  assert.equal(runs.length, 2);
  const children = (run) => received.filter((s) => s.parentSpanId === run.spanId).map((s) => [s.name, s.kind, s.attributes['idem.key']]);
  // A new key: its claim and its completion; a replay: one read of the claim.
  assert.deepEqual(children(runs[0]), [
    ['idem.store insert', 3 /* CLIENT in OTLP */, key],
    ['idem.store replace', 3, key],
  ]);
  assert.deepEqual(children(runs[1]), [['idem.store insert', 3, key]]);
}

test('over an asynchronous store each store call is a child span of its run', async () => {
  await storeCallsAreChildren(asyncOver(new MemoryStore()), 'async-1');
});

test('over RedisStore each store call is a child span of its run', { skip: skipWithout('IDEM_TEST_REDIS_URL') }, async () => {
  const store = await redisStore();
  try {
    await storeCallsAreChildren(store, 'redis-1');
  } finally {
    await store.cleanUp();
  }
});

test('a request through the Express middleware is one idem.run span under the scoped key', async () => {
  const app = express();
  app.use(idempotency({ guard: Guard.load() }));
  app.post('/orders', (req, res) => res.status(201).send('ok'));
  const server = createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${server.address().port}/orders`;
    for (let i = 0; i < 2; i++) await fetch(url, { method: 'POST', headers: { 'idempotency-key': 'http-1' }, body: 'x' });
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
  await flushed();
  assert.deepEqual(
    named('idem.run', 'anon/http-1').map((s) => s.attributes['idem.outcome']),
    ['executed', 'replayed'],
  );
});

test('tracing: false starts no span even with a provider registered', async () => {
  const before = received.length;
  const guard = Guard.load({ store: new MemoryStore(), tracing: false });
  await guard.run('untraced', 'fp', async () => ({ status: 200 }));
  await flushed();
  assert.equal(received.length, before);
  assert.equal(new Tracing(false).tracer(), null);
  assert.notEqual(new Tracing(true).tracer(), null);
});
