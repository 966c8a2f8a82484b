// A synchronous store answered in a later turn of the event loop, as a
// network store is: the guard over it is an AsyncGuard, and every call goes
// through the journal (journal.js). For tests; not part of the package.

/** `inner` (a MemoryStore, say) behind `async` methods that answer after a setImmediate. */
export function asyncOver(inner) {
  const later =
    (op) =>
    async (...args) => {
      await new Promise((resolve) => setImmediate(resolve));
      return inner[op](...args);
    };
  return { inner, async: true, clock: inner.clock, get: later('get'), insert: later('insert'), replace: later('replace'), delete: later('delete') };
}
