// The package's native fingerprint (fingerprint.js: `wit/guard.wit`'s
// specification written with node:crypto from the WIT's text alone)
// reproduces every vector in conformance/fingerprint-vectors.json and agrees
// with the component on random requests (non-ASCII methods and header names
// included).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { Guard, ManualClock, MemoryStore, fingerprint as nativeFingerprint } from '../index.js';

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

test('long, non-ASCII and large parts hash as the component hashes them, whichever way fingerprint.js writes them', () => {
  // fingerprint.js writes short ASCII strings by a loop, longer or non-ASCII
  // ones by Buffer's UTF-8 writer, keeps a scratch buffer that grows, and
  // hashes a message over 1 MiB part by part: each path against the component.
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000_000), maxResponseBytes: 4 << 20 });
  const long = 'x'.repeat(200);
  const requests = [
    { method: 'pOsT', path: `/${long}`, headers: [['Content-Type', `${long}é`]], body: `${long}Σσ\u{1F600}` },
    {
      method: 'post',
      path: '/a',
      headers: [
        ['B', 'x'],
        ['a', 'y'],
        ['A', 'b'],
        ['Ä', 'z'],
      ],
      body: '\ud800 lone',
    },
    { method: 'PUT', path: '/', headers: [], body: Buffer.alloc(100_000, 7) }, // the scratch buffer grows
    { method: 'PUT', path: '/big', headers: [['content-type', 'application/octet-stream']], body: Buffer.alloc((1 << 20) + 1, 9) }, // part by part
    {
      method: 'PUT',
      path: '/big-string',
      headers: [
        ['X', 'y'],
        ['x', 'Y'],
      ],
      body: 'é'.repeat(400_000),
    }, // over 1 MiB as UTF-8
    { method: 'GET', path: '/after' }, // the scratch buffer after all that
  ];
  for (const request of requests) {
    assert.equal(nativeFingerprint(request), guard.fingerprint(request), `${request.method} ${request.path.slice(0, 20)}`);
  }
  assert.throws(() => nativeFingerprint({ method: 1, path: '/' }), /method as a string/);
  assert.throws(() => nativeFingerprint({ method: 'GET', path: '/', headers: [[7, 'v']] }), /header name string/);
});

test('string header values, mixed-case names sorted as lowered and strings either side of the loop-written length agree with the component', () => {
  // fingerprint.js sorts ASCII names without lowering a copy, writes short
  // strings by a loop that must notice a non-ASCII char anywhere in them, and
  // keeps its sort arrays between calls: random requests of string parts,
  // against the component.
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000_000) });
  let seed = 43;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  const text = (n, alphabet) => Array.from({ length: n }, () => pick(alphabet)).join('');
  const ascii = [...'aAbBzZ-_/ 0~\u007f'];
  const any = [...ascii, 'é', 'Ä', '\u0080', '\u{1F600}'];
  for (let i = 0; i < 400; i += 1) {
    const headers = Array.from({ length: Math.floor(next() * 5) }, () => [
      text(1 + Math.floor(next() * 3), next() < 0.9 ? ascii : any),
      text(Math.floor(next() * 4), next() < 0.8 ? ascii : any),
    ]);
    if (headers.length > 0 && next() < 0.4) headers.push([headers[0][0].toUpperCase(), next() < 0.5 ? headers[0][1] : Buffer.from(text(2, any))]);
    const long = 126 + Math.floor(next() * 5); // around the loop's limit
    const request = {
      method: text(1 + Math.floor(next() * 6), next() < 0.9 ? ascii : any),
      path: text(next() < 0.5 ? long : 5, next() < 0.8 ? ascii : any),
      headers,
      body: next() < 0.5 ? text(next() < 0.5 ? long : 20, next() < 0.8 ? ascii : any) : Buffer.from(text(30, any)),
    };
    assert.equal(nativeFingerprint(request), guard.fingerprint(request), JSON.stringify(request));
  }
});
