// The package's native fingerprint (fingerprint.js: `wit/guard.wit`'s
// specification written with node:crypto from the WIT's text alone)
// reproduces every vector in conformance/fingerprint-vectors.json and agrees
// with the component on random requests (non-ASCII methods and header names
// included).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fingerprint as nativeFingerprint, Guard, ManualClock, MemoryStore } from '../index.js';

const encoder = new TextEncoder();

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
