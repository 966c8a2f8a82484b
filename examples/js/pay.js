import { Guard, MemoryStore } from '@idem/guard';

const guard = Guard.load({ store: new MemoryStore(), leaseMs: 30_000 });

export async function pay(ledger, orderId, cents) {
  const result = await guard.run(`pay:${orderId}`, `cents=${cents}`, async (fence) => {
    const receipt = await ledger.charge(orderId, cents, fence); // at most once per order
    return { status: 200, body: JSON.stringify(receipt) };
  });
  if (result.outcome !== 'executed' && result.outcome !== 'replayed') {
    throw new Error(`payment ${orderId} not run: ${result.outcome}`); // in-flight, conflict, unavailable
  }
  return JSON.parse(new TextDecoder().decode(result.response.body));
}
