// The HTTP conformance scenarios (conformance/http/*.json) against two
// targets: the Express middleware (`@idem/guard/express`) over a Guard and
// MemoryStore, and the `idem serve` gateway (the reference), started in
// front of an upstream this test runs. The Python package plays the same
// files against its ASGI middleware (tests/test_http_conformance.py).
//
// The gateway needs an idem binary: $IDEM_BIN, else target/release/idem or
// target/debug/idem in the repository ($CARGO_TARGET_DIR if set); without
// one its scenarios are skipped, saying so.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import express from 'express';
import { idempotency, scopedKey } from '../express.js';
import { Guard, MemoryStore } from '../index.js';
import { HandlerState, loadScenarios, play } from './http-scenarios.js';

const scenarios = loadScenarios();

test('there are HTTP scenarios to play', () => {
  assert.ok(scenarios.length >= 8, `only ${scenarios.length} scenarios in conformance/http`);
});

function listen(server) {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${server.address().port}`)));
}

function close(server) {
  server.closeAllConnections?.();
  return new Promise((resolve) => server.close(() => resolve()));
}

async function expressTarget(config) {
  const store = new MemoryStore();
  const guard = Guard.load({ store });
  const state = new HandlerState();
  const app = express();
  app.set('env', 'test'); // no stack traces on stderr for the failing handler
  app.use(idempotency({ guard, requireKey: config.require_key ?? false }));
  app.use((req, res, next) => state.handle(req, res).catch(next));
  const server = createServer(app);
  const url = await listen(server);
  return {
    url,
    state,
    storeDown() {
      store.fault('get', { kind: 'error', message: 'store down' });
      store.fault('insert', { kind: 'error', message: 'store down' });
    },
    storeUp() {
      store.clearFaults();
    },
    stop: () => close(server),
  };
}

// Every scenario against a fresh target of one kind, stopped after it.
function playAll(startTarget) {
  for (const scenario of scenarios) {
    test(`${scenario.file}: ${scenario.name}`, async () => {
      const target = await startTarget(scenario.config ?? {});
      try {
        assert.ok((await play(scenario, target)) > 0, 'the scenario checked nothing');
      } finally {
        await target.stop();
      }
    });
  }
}

describe('Express middleware', () => playAll(expressTarget));

// A runner that skipped a check would pass anything: each expected status
// and run count, changed, must fail its scenario.
test('the runner fails a scenario whose expectation is changed', async () => {
  let broken = 0;
  for (const scenario of scenarios) {
    for (const [i, step] of scenario.steps.entries()) {
      for (const field of ['status', 'runs']) {
        if (typeof step.expect?.[field] !== 'number') continue;
        const mutated = structuredClone(scenario);
        mutated.steps[i].expect[field] += 1;
        const target = await expressTarget(scenario.config ?? {});
        try {
          await assert.rejects(play(mutated, target), new RegExp(`step ${i}`), `${scenario.file} step ${i}: ${field} changed, yet it passed`);
        } finally {
          for (const step of mutated.steps) if (step.handler?.hold) target.state.unhold(step.handler.hold);
          await target.stop();
        }
        broken += 1;
      }
    }
  }
  assert.ok(broken > 20, `only ${broken} expectations changed`);
});

const root = fileURLToPath(new URL('../../..', import.meta.url));
const targetDir = process.env.CARGO_TARGET_DIR || join(root, 'target');
const idemBin = [process.env.IDEM_BIN, join(targetDir, 'release', 'idem'), join(targetDir, 'debug', 'idem')].find((p) => p && existsSync(p));

/**
 * `idem serve` started with ARGS on free ports (port 0): resolves with the
 * proxy's and the admin API's addresses from the lines it prints once bound.
 * If it exits first, or prints nothing in 60 s (a loaded machine compiling
 * the component in a debug build), it is killed and this rejects with what
 * it printed, so no test waits on a child left running.
 */
function startIdem(args) {
  const child = spawn(idemBin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise((resolve) => child.on('exit', resolve));
  let stderr = '';
  const bound = new Promise((resolve, reject) => {
    let waiting = true;
    const timer = setTimeout(() => fail('printed no addresses in 60 s'), 60_000);
    function fail(why) {
      if (!waiting) return;
      waiting = false;
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(new Error(`idem ${args.join(' ')}: ${why}; its stderr: ${JSON.stringify(stderr)}`));
    }
    child.on('exit', (code, signal) => fail(`exited (${signal ?? code}) before it listened`));
    child.on('error', (e) => fail(e.message));
    child.stderr.on('data', (d) => {
      stderr += d;
      const proxy = /^idem serve: (http:\/\/\S+) ->/m.exec(stderr);
      const admin = /^admin API: (http:\/\/\S+)\/v1\/stats$/m.exec(stderr);
      if (waiting && proxy && admin) {
        waiting = false;
        clearTimeout(timer);
        resolve({ url: proxy[1], admin: admin[1] });
      }
    });
  });
  return { child, exited, bound };
}

/** `idem serve` with a memory store in front of an upstream running the scenario handler. */
async function gatewayTarget(config) {
  const state = new HandlerState();
  const upstream = createServer((req, res) => {
    // A failing handler breaks the connection: the gateway answers 502 and releases the key.
    state.handle(req, res).catch(() => res.socket?.destroy());
  });
  const upstreamUrl = await listen(upstream);
  const { child, exited, bound } = startIdem([
    'serve',
    '--listen',
    '127.0.0.1:0',
    '--upstream',
    upstreamUrl,
    '--store',
    'memory:',
    '--admin-listen',
    '127.0.0.1:0',
    '--require-key',
    String(config.require_key ?? false),
  ]);
  let url, admin;
  try {
    ({ url, admin } = await bound);
  } catch (e) {
    await close(upstream);
    throw e;
  }
  const faults = async (rule) => {
    const response = await fetch(`${admin}/v1/faults`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ faults: { get: rule, insert: rule } }),
    });
    assert.equal(response.status, 200, await response.text());
  };
  return {
    url,
    admin,
    state,
    storeDown: () => faults({ kind: 'error', message: 'store down' }),
    storeUp: () => faults({ kind: 'off' }),
    async stop() {
      child.kill('SIGTERM');
      await exited;
      await close(upstream);
    },
  };
}

// examples/run-polyglot-tests.sh sets IDEM_GATEWAY_REQUIRED: there a missing binary is a failure, not a skip.
test('an idem binary for the gateway scenarios, where one is required', { skip: !process.env.IDEM_GATEWAY_REQUIRED }, () => {
  assert.ok(idemBin, `no idem binary at $IDEM_BIN (${process.env.IDEM_BIN}) or in ${targetDir}`);
});

describe('idem serve gateway', { skip: !idemBin && 'no idem binary (set IDEM_BIN, or build target/release/idem)' }, () => playAll(gatewayTarget));

// The middleware stores keys as the gateway does, so the two can share a store
// and an operator finds a key under the same name in both.
test('the gateway stores a key under the scope the middleware computes', { skip: !idemBin && 'no idem binary' }, async () => {
  const target = await gatewayTarget({});
  try {
    const sent = await fetch(`${target.url}/orders`, { method: 'POST', headers: { authorization: 'Bearer alice', 'idempotency-key': 'k' }, body: 'x' });
    assert.equal(sent.status, 201);
    const key = scopedKey('Bearer alice', 'k');
    assert.equal(key, '9d7cce461e4b2f09/k');
    const record = await fetch(`${target.admin}/v1/keys/${encodeURIComponent(key)}`);
    assert.equal(record.status, 200, await record.text());
  } finally {
    await target.stop();
  }
});
