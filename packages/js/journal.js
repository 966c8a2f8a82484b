// Running the guard over an asynchronous store by replaying each call from a
// journal of import answers ("Replaying a call" in wit/guard.wit).
//
// The component's imports are synchronous: a store import must answer before
// the guest goes on. A Redis or PostgreSQL client in Node.js answers in a
// later turn of the event loop. The guest keeps no state between calls, and
// what an export does depends only on its arguments and its imports'
// answers, so the guard runs the export with every import answered from a
// journal; the first store call the journal cannot answer goes to the store
// at once (its round trip overlaps the rest of the run) and is answered
// `store-error::unavailable` (so is every later store call of that run,
// without touching the store; the clock, random and the response's methods
// answer as usual). Once the export has returned, the store's answer (a
// value, or the `StoreError` it threw) is appended and the export runs again
// from the start, until a run needs nothing new. `clock.now-ms` and
// `random.random-u64` are journaled as the first run called them. A
// response never sits in the journal as a handle: an answer that carries
// one (an entry `get` or `insert` read) holds the store's response itself,
// and the binding hands each run a new handle to it, as it hands each run
// `complete`'s response anew; a run's handles end with it. So the
// store sees each primitive once, in the order and at the point a
// synchronous host would have called it, no store call is ever started that
// the guest would not have made, and a run that went on without an answer is
// discarded whole: nothing it decided after the pending call is acted on.
//
// A run that asks for something else than the journal holds at the same
// place (another primitive, or another key), or returns before it has read
// every answer the journal holds, has diverged: the guest broke
// its side of the contract, or a store answered differently on a replay.
// The call then fails closed (`GuardError` `unavailable`), naming both.

import { StoreFailure } from './idem-abi.js';

/** The answer a run gets for a store call the journal cannot give yet. */
const NOT_YET = { tag: 'unavailable', val: 'asynchronous store call pending (replay)' };

/** Returned to the guest as `store-error`: a thrown value costs V8 several microseconds on its way through the guest's frames. */
const UNANSWERED = new StoreFailure(NOT_YET);

/** At most this many runs of one export: each run but the last adds one store answer. */
const MAX_RUNS = 32;

/**
 * The import answers of one export call, in the order the guest asked for
 * them: `{ op, key, value }`, `{ op, key, error }` (a thrown value), or, for
 * the clock and the randomness, `{ op, value }`.
 */
export class Journal {
  entries = [];
  /** Where the current run reads next. */
  at = 0;
  /** The store call the current run asked for beyond the journal, started: `{ op, key, answer }` (a Promise of its entry). */
  pending = null;
  /** Why the current run disagreed with the journal, or null. */
  diverged = null;
  #store;
  /** `(op, key)` → the function that ends that call's span (with its error), or null: not traced. */
  #traced;

  /** A journal whose pending calls go to `store` (each in a span of its own when `traced` is given). */
  constructor(store, traced = null) {
    this.#store = store;
    this.#traced = traced;
  }

  rewind() {
    this.at = 0;
    this.pending = null;
    this.diverged = null;
  }

  /** A clock or random answer: the journal's, else `fresh()` recorded (not once the run is lost). */
  local(op, fresh) {
    if (this.pending || this.diverged) return fresh();
    if (this.at < this.entries.length) {
      const entry = this.entries[this.at++];
      if (entry.op === op) return entry.value;
      this.diverged = `the guest asked for ${op} where the journal holds ${describe(entry)}`;
      return fresh();
    }
    const value = fresh();
    this.entries.push({ op, value });
    this.at += 1;
    return value;
  }

  /**
   * A store answer: the journal's (returned, or its error thrown), else
   * remembered as pending and answered unavailable (a `StoreFailure`
   * returned, as when the run has diverged).
   */
  store(op, key, args) {
    if (this.pending || this.diverged) return UNANSWERED;
    if (this.at < this.entries.length) {
      const entry = this.entries[this.at++];
      if (entry.op !== op || entry.key !== key) {
        this.diverged = `the guest asked for ${op}(${JSON.stringify(key)}) where the journal holds ${describe(entry)}`;
        return new StoreFailure({ tag: 'unavailable', val: this.diverged });
      }
      if ('error' in entry) throw entry.error;
      return entry.value;
    }
    this.pending = { op, key, answer: this.#start(op, key, args) };
    return UNANSWERED;
  }

  /**
   * The store call, started: a Promise of its entry, never rejected. A
   * `StoreError` reaches the guest as `store-error`; anything else thrown is
   * a host bug and traps the instance on the next run.
   */
  #start(op, key, args) {
    const end = this.#traced === null ? null : this.#traced(op, key);
    try {
      return Promise.resolve(this.#store[op](...args)).then(
        (value) => {
          end?.(value instanceof StoreFailure ? value : undefined);
          return { op, key, value };
        },
        (error) => {
          end?.(error);
          return { op, key, error };
        },
      );
    } catch (error) {
      end?.(error);
      return Promise.resolve({ op, key, error });
    }
  }
}

function describe(entry) {
  return entry.key === undefined ? entry.op : `${entry.op}(${JSON.stringify(entry.key)})`;
}

/**
 * The store, clock and random the guest instance of an asynchronous guard
 * is given: each answers from the journal of the export call running now
 * (runs are synchronous, so there is at most one).
 */
export class JournalPort {
  /** The journal of the run in progress (null between runs). */
  journal = null;
  #clock;
  #random;

  constructor(clock, random) {
    this.#clock = clock;
    this.#random = random;
  }

  #current() {
    if (!this.journal) throw new Error('a guest import was called outside a journaled run');
    return this.journal;
  }

  nowMs() {
    return this.#current().local('now-ms', () => this.#clock.nowMs());
  }

  randomU64() {
    return this.#current().local('random-u64', () => this.#random.randomU64());
  }

  /** Whether the run in progress will be discarded (a store call pending, or diverged): its export's value is not read. */
  runLost() {
    const j = this.journal;
    return j !== null && (j.pending !== null || j.diverged !== null);
  }

  /**
   * Whether the next store call reads its record: only a call the journal
   * will remember as pending does (the others are answered from entries
   * that are checked by primitive and key).
   */
  readsRecord() {
    const j = this.#current();
    return j.pending === null && j.diverged === null && j.at >= j.entries.length;
  }

  get(key, nowMs) {
    return this.#current().store('get', key, [key, nowMs]);
  }

  insert(key, record, nowMs) {
    return this.#current().store('insert', key, [key, record, nowMs]);
  }

  replace(key, expectedVersion, record, nowMs) {
    return this.#current().store('replace', key, [key, expectedVersion, record, nowMs]);
  }

  delete(key, expectedVersion, nowMs) {
    return this.#current().store('delete', key, [key, expectedVersion, nowMs]);
  }
}

/**
 * Runs `call()` (one synchronous run of an export over `port`) until a run
 * needs no new store answer, performing each pending call on `store` in
 * between. Resolves to `finish` of the last run's result. `call` reports a
 * trap by throwing; a run that traps is not replayed (the trap is rethrown,
 * nothing more is sent to the store). `onDiverged(message)` makes the error for a
 * run that disagreed with the journal; `finish(value)` makes the last run's
 * value the call's (or throws), inside this one async function. `traced`,
 * when given, is called as each store call starts, `(op, key)`, and returns
 * the function called once it has settled (with its error, if any).
 */
export async function replay(port, store, call, onDiverged, finish = (value) => value, traced = null) {
  const journal = new Journal(store, traced);
  for (let run = 1; ; run++) {
    journal.rewind();
    port.journal = journal;
    let value;
    try {
      value = call();
    } finally {
      port.journal = null;
    }
    if (journal.diverged) throw onDiverged(journal.diverged);
    if (!journal.pending) {
      // A run that ends without the answers an earlier run asked for decided on less than they say.
      if (journal.at < journal.entries.length) {
        throw onDiverged(`the guest returned after ${journal.at} of the journal's ${journal.entries.length} answers`);
      }
      return finish(value);
    }
    if (run === MAX_RUNS) throw onDiverged(`still asking the store for more after ${MAX_RUNS} runs`);
    journal.entries.push(await journal.pending.answer);
  }
}
