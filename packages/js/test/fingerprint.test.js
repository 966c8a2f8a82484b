// The fingerprint as `wit/guard.wit` specifies it, written natively with
// node:crypto from the WIT's text alone: it reproduces every vector in
// conformance/fingerprint-vectors.json and agrees with the component on
// random requests (non-ASCII methods and header names included).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Guard, ManualClock, MemoryStore } from '../index.js';

const encoder = new TextEncoder();

function u64be(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

/** ASCII-only case mapping of UTF-8 bytes: `from`..`from+25` shifted by `by`. */
function asciiShift(bytes, from, by) {
  return Uint8Array.from(bytes, (b) => (b >= from && b < from + 26 ? b + by : b));
}

function compareBytes(a, b) {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

export function nativeFingerprint({ method, path, headers = [], body = new Uint8Array() }) {
  const hash = createHash('sha256');
  const part = (bytes) => {
    hash.update(u64be(bytes.length));
    hash.update(bytes);
  };
  const pairs = headers
    .map(([name, value]) => [asciiShift(encoder.encode(name), 0x41, 0x20), Uint8Array.from(value)])
    .sort((x, y) => compareBytes(x[0], y[0]) || compareBytes(x[1], y[1]));
  part(encoder.encode('idem-fingerprint-v1'));
  part(asciiShift(encoder.encode(method), 0x61, -0x20));
  part(encoder.encode(path));
  part(u64be(pairs.length));
  for (const [name, value] of pairs) {
    part(name);
    part(value);
  }
  part(body);
  return `sha256:${hash.digest('hex')}`;
}

/** A scenario's bytes: a UTF-8 string or `{ hex }`. */
function bytes(v) {
  if (v && typeof v.hex === 'string') return Uint8Array.from(Buffer.from(v.hex, 'hex'));
  return encoder.encode(v);
}

test('every fingerprint vector is reproduced natively from the WIT text', () => {
  let checked = 0;
  for (const file of ['fingerprint-vectors.json', 'fingerprint-canonical.json']) {
    const scenario = JSON.parse(readFileSync(new URL(`../../../conformance/${file}`, import.meta.url), 'utf8'));
    for (const step of scenario.steps.filter((s) => s.op === 'fingerprint')) {
      const r = step.request;
      const got = nativeFingerprint({
        method: r.method,
        path: r.path,
        headers: r.headers.map(([n, v]) => [n, bytes(v)]),
        body: bytes(r.body),
      });
      assert.equal(got, step.expect.fingerprint, `${file}: ${step.why ?? JSON.stringify(r)}`);
      checked += 1;
    }
  }
  assert.ok(checked >= 24, `only ${checked} vectors`);
});

test('the component and the native fingerprint agree on random requests', () => {
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000_000) });
  let seed = 16;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const alphabet = [...'aAzZ-_/?=&é ÖöΣσx0\u007f'];
  const word = (n) => Array.from({ length: Math.floor(next() * (n + 1)) }, () => alphabet[Math.floor(next() * alphabet.length)]).join('');
  const blob = (n) => Uint8Array.from({ length: Math.floor(next() * (n + 1)) }, () => Math.floor(next() * 256));
  for (let i = 0; i < 300; i += 1) {
    const headers = Array.from({ length: Math.floor(next() * 5) }, () => [word(6), blob(4)]);
    if (headers.length > 0 && next() < 0.3) headers.push([headers[0][0].toUpperCase(), headers[0][1]]);
    const request = { method: word(5), path: word(12), headers, body: blob(40) };
    assert.equal(guard.fingerprint(request), nativeFingerprint(request), JSON.stringify(request));
  }
});
