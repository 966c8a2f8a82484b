// The conformance scenarios (conformance/*.json, format in
// conformance/README.md) as a runner over any guard host: `play(scenario,
// host)` performs each step through `host` and checks its result. For tests;
// not part of the package (not in package.json `files`), and outside test/ so
// `node --test test/` does not run it as a test file.
//
// A host has the guard's calls, its clock, and its store's faults and records:
//
//   clock: { set(ms), advance(ms) }
//   begin(key, fingerprint)          -> { tag: 'proceed', val: claim } | { tag: 'replay', val: response }
//                                       | { tag: 'in-flight', val: ms } | { tag: 'conflict' }
//   complete(claim, response), release(claim)
//   renew(claim), saveCheckpoint(claim, { phase, data })  -> claim
//   fingerprint({ method, path, headers, body })          -> 'sha256:…'
//   setFault(primitive, { kind, message, count }), clearFaults()
//   peek(key)                        -> null | { record: { …, response? }, version }
//
// (each may return a Promise). A guard error is thrown as a `Failure` (its
// `kind` the guard-error case, its `detail` the text). Claims are as jco lifts
// them ({ key, fingerprint, fence, holder, leaseUntilMs, expiresAtMs,
// checkpoint }, u64s as BigInts); responses are { status, headers: [[name,
// Uint8Array]], body: Uint8Array }. A host with a `run(step, effects)` of its
// own (a guard's `run`: test/conformance.test.js) answers `run` steps itself;
// for one without, a `run` step is the lifecycle over those calls (`run` below).

import { readdirSync, readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';

const dir = new URL('../../../conformance/', import.meta.url);

/** The scenario files' names, sorted. */
export const files = readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .sort();

/** The scenario in `file`. */
export const load = (file) => JSON.parse(readFileSync(new URL(file, dir), 'utf8'));

/** A guard error: `kind` is `unavailable`, `invalid-input` or `stale-claim`. */
export class Failure extends Error {
  constructor(kind, detail) {
    super(`${kind}: ${detail}`);
    this.kind = kind;
    this.detail = detail;
  }
}

const decoder = new TextDecoder();

/** A string field: a string, or `{ repeat, times }`. */
export function text(v) {
  if (typeof v === 'string') return v;
  if (v && typeof v.repeat === 'string') return v.repeat.repeat(v.times);
  throw new Error(`expected a string, got ${JSON.stringify(v)}`);
}

/** A bytes field: a UTF-8 string, `{ hex }` or `{ repeat, times }`. */
export function bytes(v) {
  if (v === undefined || v === null) return new Uint8Array();
  if (v && typeof v.hex === 'string') return Uint8Array.from(v.hex.match(/../g) ?? [], (h) => parseInt(h, 16));
  return new TextEncoder().encode(text(v));
}

export const hex = (b) => Buffer.from(b).toString('hex');

/** A step's response. */
export function response(v) {
  return { status: v.status, headers: (v.headers ?? []).map(([n, val]) => [text(n), bytes(val)]), body: bytes(v.body) };
}

export function responseJson(r) {
  return { status: r.status, headers: r.headers.map(([n, v]) => [n, decoder.decode(v)]), body_hex: hex(r.body) };
}

/** A checkpoint in a result: `null`, or `{ phase, data_hex }`. */
export const checkpointJson = (c) => (c ? { phase: c.phase, data_hex: hex(c.data) } : null);

// `holder` stays a BigInt (holder ids are random u64s); `holder_of` compares it with a kept claim's.
export const claimJson = (c) => ({
  fence: Number(c.fence),
  holder: c.holder,
  lease_until_ms: Number(c.leaseUntilMs),
  expires_at_ms: Number(c.expiresAtMs),
  checkpoint: checkpointJson(c.checkpoint),
});

/** JSON for a failure message: BigInts (holder ids) as decimal strings. */
export const show = (v) => JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? String(x) : x));

function errorJson(e) {
  if (e instanceof Failure) return { error: e.kind, message: e.detail };
  throw e;
}

/** Each decision's value as the fields beside its name in a result, by its tag. */
const DECISION_FIELDS = {
  proceed: claimJson,
  replay: responseJson,
  'in-flight': (retryAfterMs) => ({ retry_after_ms: Number(retryAfterMs) }),
  conflict: () => ({}),
};

/** The fields of decision `d`'s value: a `begin` step's result and a `run` step's outcome both carry them. */
function decisionFields(d) {
  if (!Object.hasOwn(DECISION_FIELDS, d.tag)) throw new Error(`unknown decision ${d.tag}`);
  return DECISION_FIELDS[d.tag](d.val);
}

export function decisionJson(d) {
  return { decision: d.tag, ...decisionFields(d) };
}

/** `ok` of what `call` returns (or resolves to), else the guard error as JSON. */
async function attempt(call, ok) {
  let value;
  try {
    value = await call();
  } catch (e) {
    return errorJson(e);
  }
  return ok(value);
}

function checkCheckpoint(name, want, actual) {
  if (want === null) return actual === null ? null : `${name} is ${show(actual)}, expected null`;
  const expected = { phase: text(want.phase), data_hex: hex(bytes(want.data)) };
  return isDeepStrictEqual(actual, expected) ? null : `${name} is ${show(actual)}, expected ${show(expected)}`;
}

/** Why `actual` does not match `expect` (conformance/README.md, "Matching"), or null; `claims` names the kept claims. */
export function check(expect, actual, claims) {
  for (const [name, want] of Object.entries(expect)) {
    if (name === 'holder_of' || name === 'holder_not_of') {
      const claim = claims.get(want);
      if (!claim) return `${name} names no kept claim ${JSON.stringify(want)}`;
      if (typeof actual.holder !== 'bigint') return 'the result has no holder';
      if ((actual.holder === claim.holder) !== (name === 'holder_of')) {
        return `holder ${actual.holder} is ${name === 'holder_of' ? 'not ' : ''}the holder of ${want} (${claim.holder})`;
      }
    } else if (name === 'checkpoint' || name === 'resumed') {
      if (!(name in actual)) return `the result has no ${name}`;
      const why = checkCheckpoint(name, want, actual[name]);
      if (why) return why;
    } else if (name === 'holder') {
      if (actual.holder !== BigInt(want)) return `holder is ${actual.holder}, expected ${want}`;
    } else if (name === 'contains') {
      for (const w of [want].flat()) {
        if (typeof actual.message !== 'string' || !actual.message.includes(w)) return `message does not contain ${JSON.stringify(w)}`;
      }
    } else if (name === 'fence_above') {
      if (!(actual.fence > want)) return `fence ${actual.fence} is not above ${want}`;
    } else if (name === 'body') {
      if (actual.body_hex !== hex(bytes(want))) return `body is ${actual.body_hex}, expected ${hex(bytes(want))}`;
    } else if (!isDeepStrictEqual(actual[name], want)) {
      return `${name} is ${show(actual[name])}, expected ${JSON.stringify(want)}`;
    }
  }
  return null;
}

/** The step's named claim, with the fields its `with` replaces (u64s as decimal strings). */
function claimOf(step, claims) {
  const claim = claims.get(step.claim);
  if (!claim) throw new Error(`no claim named ${step.claim}`);
  const altered = { ...claim };
  for (const [field, value] of Object.entries(step.with ?? {})) {
    if (!['holder', 'fence'].includes(field)) throw new Error(`with.${field}: not a field a step replaces`);
    if (typeof value !== 'string' || !/^\d+$/.test(value)) throw new Error(`with.${field}: a u64 as a decimal string`);
    altered[field] = BigInt(value);
  }
  return altered;
}

/**
 * A `run` step over the host's calls: begin; on a claim the handler counts
 * its side effect in `effects`, saves the step's checkpoints through
 * `saveCheckpoint` (a failure fails the handler), then fails (`fails`) or
 * answers; then `complete`, or `release` if it failed. As the Rust runner's
 * default `GuardHost::run`.
 */
async function run(host, step, effects) {
  let decision;
  try {
    decision = await host.begin(text(step.key), text(step.fingerprint));
  } catch (e) {
    if (e instanceof Failure && e.kind === 'invalid-input') return errorJson(e);
    if (e instanceof Failure) return { outcome: 'unavailable', message: e.detail };
    throw e;
  }
  if (decision.tag !== 'proceed') return { outcome: decision.tag === 'replay' ? 'replayed' : decision.tag, ...decisionFields(decision) };
  let claim = decision.val;
  const resumed = checkpointJson(claim.checkpoint);
  const name = step.effect ?? 'effect';
  effects.set(name, (effects.get(name) ?? 0) + 1);
  let failed = false;
  try {
    for (const c of step.checkpoints ?? []) claim = await host.saveCheckpoint(claim, { phase: text(c.phase), data: bytes(c.data) });
  } catch (e) {
    if (!(e instanceof Failure)) throw e;
    failed = true;
  }
  if (failed || step.fails) {
    try {
      await host.release(claim);
    } catch (e) {
      if (!(e instanceof Failure)) throw e; // the lease runs out as usual
    }
    return { outcome: 'handler-failed' };
  }
  const answer = response(step.response);
  try {
    await host.complete(claim, answer);
  } catch (e) {
    if (e instanceof Failure) return { outcome: 'not-recorded', ...errorJson(e) };
    throw e;
  }
  return { outcome: 'executed', ...responseJson(answer), resumed };
}

/** Performs one step on `host`; returns the result to check, or null for a step without one. */
async function perform(host, step, claims, effects) {
  switch (step.op) {
    case 'clock':
      if (step.set_ms !== undefined) host.clock.set(step.set_ms);
      else if (step.advance_ms !== undefined) host.clock.advance(step.advance_ms);
      else throw new Error('clock needs set_ms or advance_ms');
      return null;
    case 'fault':
      if (!['error', 'lost'].includes(step.kind)) throw new Error(`unknown fault kind ${step.kind}`);
      await host.setFault(step.primitive, { kind: step.kind, message: step.message ?? 'injected fault', count: step.count });
      return null;
    case 'clear_faults':
      await host.clearFaults();
      return null;
    case 'begin':
      return attempt(
        () => host.begin(text(step.key), text(step.fingerprint)),
        (d) => {
          if (d.tag === 'proceed' && step.as) claims.set(step.as, d.val);
          return decisionJson(d);
        },
      );
    case 'complete':
      return attempt(
        () => host.complete(claimOf(step, claims), response(step.response)),
        () => ({ ok: true }),
      );
    case 'release':
      return attempt(
        () => host.release(claimOf(step, claims)),
        () => ({ ok: true }),
      );
    case 'renew':
    case 'checkpoint':
      return attempt(
        () =>
          step.op === 'renew'
            ? host.renew(claimOf(step, claims))
            : host.saveCheckpoint(claimOf(step, claims), { phase: text(step.phase), data: bytes(step.data) }),
        (c) => {
          if (step.as) claims.set(step.as, c);
          return { ok: true, ...claimJson(c) };
        },
      );
    case 'run':
      return host.run ? host.run(step, effects) : run(host, step, effects);
    case 'effects':
      return Object.fromEntries(Object.keys(step.expect).map((name) => [name, effects.get(name) ?? 0]));
    case 'peek': {
      const entry = await host.peek(text(step.key));
      if (!entry) return { absent: true };
      const r = entry.record;
      return {
        absent: false,
        state: r.state,
        version: Number(entry.version),
        fingerprint: r.fingerprint,
        holder: r.holder,
        lease_until_ms: Number(r.leaseUntilMs),
        expires_at_ms: Number(r.expiresAtMs),
        checkpoint: checkpointJson(r.checkpoint),
        ...(r.response ? responseJson(r.response) : {}),
      };
    }
    case 'fingerprint': {
      const q = step.request;
      const parts = { method: text(q.method), path: text(q.path), headers: (q.headers ?? []).map(([n, v]) => [text(n), bytes(v)]), body: bytes(q.body) };
      return attempt(
        () => host.fingerprint(parts),
        (fingerprint) => ({ fingerprint }),
      );
    }
  }
  throw new Error(`unknown op ${step.op}`);
}

/** Runs `scenario` on `host` (fresh: an empty store, its clock at `clock_ms`); returns the number of checked steps, or throws `step N (op): ...`. */
export async function play(scenario, host) {
  const claims = new Map();
  const effects = new Map();
  let checked = 0;
  for (const [i, step] of scenario.steps.entries()) {
    for (let n = 0; n < (step.times ?? 1); n++) {
      let actual;
      try {
        actual = await perform(host, step, claims, effects);
      } catch (e) {
        throw new Error(`step ${i} (${step.op}): ${e.message}`, { cause: e });
      }
      if (actual === null) continue;
      if (!step.expect) throw new Error(`step ${i} (${step.op}): no expect`);
      const why = check(step.expect, actual, claims);
      if (why) throw new Error(`step ${i} (${step.op}): ${why}; got ${show(actual)}`);
      checked += 1;
    }
  }
  return checked;
}

/** For each step with an expectation `mutate` can break: `[its index, the scenario with that one expectation wrong]`. */
export function mutants(scenario) {
  const out = [];
  for (const [i, step] of scenario.steps.entries()) {
    const wrong = mutate(step.expect);
    if (!wrong) continue;
    const mutant = structuredClone(scenario);
    mutant.steps[i].expect = wrong;
    out.push([i, mutant]);
  }
  return out;
}

/** A plausible wrong answer for an expectation (as the Rust runner's `mutate`), or null. */
export function mutate(expect) {
  if (!expect) return null;
  const wrong = { ...expect };
  if (typeof wrong.decision === 'string') wrong.decision = wrong.decision === 'proceed' ? 'in-flight' : 'proceed';
  else if (typeof wrong.outcome === 'string') wrong.outcome = wrong.outcome === 'executed' ? 'replayed' : 'executed';
  else if (typeof wrong.error === 'string') wrong.error = wrong.error === 'stale-claim' ? 'unavailable' : 'stale-claim';
  else if ('ok' in wrong) {
    delete wrong.ok;
    wrong.error = 'unavailable';
  } else if (typeof wrong.absent === 'boolean') wrong.absent = !wrong.absent;
  else {
    const n = Object.keys(wrong).find((k) => Number.isInteger(wrong[k]));
    const s = Object.keys(wrong).find((k) => typeof wrong[k] === 'string');
    if (n !== undefined) wrong[n] += 1;
    else if (s !== undefined) wrong[s] += '!';
    else return null;
  }
  return wrong;
}
