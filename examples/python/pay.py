import json

from idem_guard import Guard, MemoryStore, Response

guard = Guard.load(store=MemoryStore(), lease_ms=30_000)


def pay(ledger, order_id: str, cents: int) -> dict:
    def charge(fence: int) -> Response:
        receipt = ledger.charge(order_id, cents, fence)  # at most once per order
        return Response(200, [], json.dumps(receipt).encode())

    outcome = guard.run(f"pay:{order_id}", f"cents={cents}", charge)
    if outcome.kind not in ("executed", "replayed"):
        raise RuntimeError(f"payment {order_id} not run: {outcome.kind}")  # in-flight, conflict, unavailable
    return json.loads(outcome.response.body)
