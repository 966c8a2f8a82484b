// The cost of one guarded call in Node.js — begin then complete on a new key,
// through the component, over the Map store — as ns/op, for
// examples/bench-hosts.sh. `node bench.js [OPS]`

import { Guard, MemoryStore } from './idem.js';

const ops = Number(process.argv[2] ?? 20_000);
const guard = Guard.load({ store: new MemoryStore() });
const response = { status: 200, headers: [['content-type', 'text/plain']], body: 'paid' };

function call(i) {
  const decision = guard.begin(`order-${i}`, 'sku=A&qty=1');
  if (decision.tag !== 'proceed') throw new Error(`a new key must proceed, got ${decision.tag}`);
  guard.complete(decision.val, response);
}

for (let i = 0; i < ops / 10; i++) call(`warm-${i}`);
const start = process.hrtime.bigint();
for (let i = 0; i < ops; i++) call(i);
const ns = Number(process.hrtime.bigint() - start) / ops;
console.log(`node    ${process.version.padEnd(17)} begin+complete  ${ops} ops  ${Math.round(ns)} ns/op`);
