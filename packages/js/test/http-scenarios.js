// Plays the HTTP conformance scenarios (conformance/http/*.json, format in
// conformance/README.md) against a target: a base URL in front of the
// scenario handler, whose runs this module counts. The Express middleware
// and the `idem serve` gateway are both played by http-conformance.test.js.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const SCENARIO_DIR = fileURLToPath(new URL('../../../conformance/http/', import.meta.url));

/** Every scenario, by file name. */
export function loadScenarios() {
  return readdirSync(SCENARIO_DIR)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((file) => ({ file, ...JSON.parse(readFileSync(join(SCENARIO_DIR, file), 'utf8')) }));
}

/**
 * The handler's state for one scenario: how many times it ran, and the
 * holds (`handler.hold`) it waits on until the scenario says `unhold`.
 */
export class HandlerState {
  runs = 0;
  #holds = new Map();

  #hold(name) {
    if (!this.#holds.has(name)) {
      let release;
      const promise = new Promise((resolve) => {
        release = resolve;
      });
      this.#holds.set(name, { promise, release });
    }
    return this.#holds.get(name);
  }

  held(name) {
    return this.#hold(name).promise;
  }

  unhold(name) {
    this.#hold(name).release();
  }

  /**
   * The scenario handler over Node's req/res: counts the run, waits on its
   * hold, fails if told to, else answers `x-handler-status` (default 201)
   * with a JSON body naming the run. `req.rawBody` is the body when a
   * middleware read it already.
   */
  async handle(req, res) {
    this.runs += 1;
    const run = this.runs;
    const body = req.rawBody ?? (await readAll(req));
    const hold = req.headers['x-handler-hold'];
    if (hold) await this.held(hold);
    if (req.headers['x-handler-fail']) throw new Error(`scenario handler failed on run ${run}`);
    res.statusCode = Number(req.headers['x-handler-status'] ?? 201);
    res.setHeader('content-type', 'application/json');
    res.setHeader('x-handler-run', String(run));
    res.end(JSON.stringify({ run, method: req.method, path: req.url, body: body.toString('latin1') }));
  }
}

export async function readAll(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** The request a `send` step describes, with `like` resolved against the named earlier ones. */
function request(send, named) {
  const base = send.like ? named.get(send.like) : {};
  assert.ok(base, `no earlier request named ${send.like}`);
  const spec = { ...base, ...send };
  delete spec.like;
  return spec;
}

function keyValue(key) {
  if (key === undefined || key === null) return undefined;
  if (typeof key === 'string') return key;
  return key.repeat.repeat(key.times);
}

async function exchange(url, spec, handler) {
  const headers = { ...(spec.headers ?? {}) };
  const key = keyValue(spec.key);
  if (key !== undefined) headers['idempotency-key'] = key;
  if (handler?.status) headers['x-handler-status'] = String(handler.status);
  if (handler?.hold) headers['x-handler-hold'] = handler.hold;
  if (handler?.fail) headers['x-handler-fail'] = '1';
  const method = spec.method ?? 'POST';
  const response = await fetch(url + spec.path, {
    method,
    headers,
    body: ['GET', 'HEAD'].includes(method) ? undefined : (spec.body ?? ''),
  });
  return { status: response.status, headers: response.headers, body: Buffer.from(await response.arrayBuffer()) };
}

/** The headers `same_as` compares: the handler's own (transport headers like date are the server's). */
const sameHeader = (name) => name === 'content-type' || name.startsWith('x-handler-');

function check(expect, got, responses, state, where) {
  const msg = (what) => `${where}: ${what} (got ${got.status} ${got.body.toString().slice(0, 300)})`;
  if (expect.status !== undefined) {
    if (expect.status === '5xx') assert.ok(got.status >= 500 && got.status <= 599, msg('expected a 5xx'));
    else assert.equal(got.status, expect.status, msg('status'));
  }
  for (const [name, want] of Object.entries(expect.headers ?? {})) {
    const have = got.headers.get(name);
    if (want === true) assert.notEqual(have, null, msg(`header ${name} present`));
    else if (want === false) assert.equal(have, null, msg(`header ${name} absent`));
    else assert.equal(have, want, msg(`header ${name}`));
  }
  if (expect.problem) {
    assert.match(got.headers.get('content-type') ?? '', /^application\/problem\+json/, msg('problem content type'));
    const body = JSON.parse(got.body.toString());
    assert.equal(body.type, `https://idem.dev/problems/${expect.problem}`, msg('problem type'));
    assert.equal(body.status, got.status, msg('problem status'));
    assert.equal(typeof body.title, 'string', msg('problem title'));
    assert.equal(typeof body.detail, 'string', msg('problem detail'));
  }
  if (expect.retry_after) {
    assert.match(got.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/, msg('Retry-After in whole seconds, at least 1'));
  }
  if (expect.same_as) {
    const first = responses.get(expect.same_as);
    assert.ok(first, `${where}: no earlier response named ${expect.same_as}`);
    assert.equal(got.status, first.status, msg(`status of ${expect.same_as}`));
    assert.deepEqual(got.body, first.body, msg(`body bytes of ${expect.same_as}`));
    for (const [name, value] of first.headers) {
      if (sameHeader(name)) assert.equal(got.headers.get(name), value, msg(`header ${name} of ${expect.same_as}`));
    }
  }
  if (expect.runs !== undefined) assert.equal(state.runs, expect.runs, msg('handler runs'));
}

/**
 * Plays one scenario. `target`: `{ url, state, storeDown(), storeUp() }`.
 * Returns the number of checks made, so a runner can tell it did something.
 */
export async function play(scenario, target) {
  const named = new Map(); // request specs
  const responses = new Map();
  const pending = new Map();
  let checks = 0;
  for (const [i, step] of scenario.steps.entries()) {
    const where = `${scenario.file} step ${i}`;
    if (step.send) {
      const spec = request(step.send, named);
      if (step.as) named.set(step.as, spec);
      const exchanging = exchange(target.url, spec, step.handler);
      if (step.background) {
        exchanging.catch(() => {}); // awaited by its `await` step; a scenario failing first must not leave it unhandled
        pending.set(step.as, exchanging);
        continue;
      }
      const got = await exchanging;
      if (step.as) responses.set(step.as, got);
      if (step.expect) {
        check(step.expect, got, responses, target.state, where);
        checks += 1;
      }
    } else if (step.await) {
      const got = await pending.get(step.await);
      responses.set(step.await, got);
      check(step.expect ?? {}, got, responses, target.state, where);
      checks += 1;
    } else if (step.wait_runs !== undefined) {
      const deadline = Date.now() + 5000;
      while (target.state.runs < step.wait_runs) {
        assert.ok(Date.now() < deadline, `${where}: the handler did not reach ${step.wait_runs} runs`);
        await new Promise((r) => setTimeout(r, 5));
      }
    } else if (step.unhold) {
      target.state.unhold(step.unhold);
    } else if (step.store === 'down') {
      await target.storeDown();
    } else if (step.store === 'up') {
      await target.storeUp();
    } else {
      assert.fail(`${where}: unknown step ${JSON.stringify(step)}`);
    }
  }
  assert.equal(pending.size, [...pending.keys()].filter((k) => responses.has(k)).length, `${scenario.file}: a background request was never awaited`);
  return checks;
}
