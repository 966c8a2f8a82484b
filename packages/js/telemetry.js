// What a guard tells the world about its calls: OpenTelemetry spans (through
// `@opentelemetry/api`, an optional peer dependency), a logger and a
// decision callback (`Guard.load({ logger, onDecision })`).
//
// OpenTelemetry is looked up once, at load, with `require` from this
// package's place (the application's `@opentelemetry/api`, whichever copy:
// the API keeps its registrations on `globalThis`, shared by every copy of
// the same major version). Without it, or with no tracer provider
// registered, no span is started: per call the guard asks the global
// provider for its delegate and compares it with the API's no-op one — a
// few property reads, no allocation. A provider registered later (or
// `trace.disable()`) takes effect at the next call.

import { createRequire } from 'node:module';

const VERSION = '0.3.0';
const NAME = '@idem/guard';

/** `@opentelemetry/api`, or null when the application has none. */
const otel = (() => {
  try {
    return createRequire(import.meta.url)('@opentelemetry/api');
  } catch {
    return null;
  }
})();

/** This copy's no-op provider: what an unregistered ProxyTracerProvider delegates to. */
const NOOP = otel ? new otel.ProxyTracerProvider().getDelegate() : null;

/**
 * The tracer spans come from, per call: the one given (`tracer` option), or
 * the global provider's when one is registered, or null (no span at all).
 */
export class Tracing {
  #given;
  #delegate = null;
  #tracer = null;

  /** `option`: `false` (never trace), `true`/undefined (the global provider), or a Tracer. */
  constructor(option) {
    this.#given = option && typeof option === 'object' ? option : null;
    this.enabled = option !== false && (this.#given !== null || otel !== null);
  }

  /** The tracer for this call, or null when nothing would record a span. */
  tracer() {
    if (!this.enabled) return null;
    if (this.#given) return this.#given;
    const provider = otel.trace.getTracerProvider();
    const delegate = typeof provider.getDelegate === 'function' ? provider.getDelegate() : provider;
    if (delegate === NOOP) return null;
    if (delegate !== this.#delegate) {
      this.#delegate = delegate;
      this.#tracer = provider.getTracer(NAME, VERSION);
    }
    return this.#tracer;
  }
}

/**
 * The span of one `run`: `idem.run`, a child of the active context, with the
 * key, and — as the call goes — the decision, the fence, the outcome and the
 * store calls (over an asynchronous store, one child span per call).
 */
export class RunSpan {
  constructor(tracer, key) {
    this.tracer = tracer;
    this.parent = otel ? otel.context.active() : undefined;
    this.span = tracer.startSpan('idem.run', { kind: 0 /* SpanKind.INTERNAL */, attributes: { 'idem.key': key } }, this.parent);
    this.context = otel ? otel.trace.setSpan(this.parent, this.span) : undefined;
  }

  set(name, value) {
    this.span.setAttribute(name, value);
  }

  /** Runs `fn(...args)` with this span active, so the handler's own spans are its children. */
  within(fn, ...args) {
    return otel ? otel.context.with(this.context, fn, undefined, ...args) : fn(...args);
  }

  /** A child span for one store call; returns the function that ends it (with the error, if any). */
  storeCall(op, key) {
    const span = this.tracer.startSpan(
      `idem.store ${op}`,
      { kind: 2 /* SpanKind.CLIENT */, attributes: { 'idem.store.op': op, 'idem.key': key } },
      this.context,
    );
    return (error) => {
      if (error !== undefined) {
        span.setAttribute('idem.store.error', error?.payload?.tag ?? 'host');
        span.setStatus({ code: 2 /* SpanStatusCode.ERROR */, message: String(error?.message ?? error?.payload?.val ?? error) });
      }
      span.end();
    };
  }

  /** Ends the span with the call's outcome; `error` (a failure the caller sees) sets its status. */
  end(outcome, error) {
    this.span.setAttribute('idem.outcome', outcome);
    if (error !== undefined) {
      if (error instanceof Error) this.span.recordException(error);
      this.span.setStatus({ code: 2 /* SpanStatusCode.ERROR */, message: String(error?.message ?? error) });
    }
    this.span.end();
  }
}

const LEVELS = ['debug', 'info', 'warn', 'error'];

/**
 * A logger as the guard calls it: `log(level, message, fields)` on any
 * object with `debug`/`info`/`warn`/`error(message, fields)` methods
 * (console, winston, or pino through `{ warn: (m, f) => pino.warn(f, m), … }`);
 * a level the object lacks is dropped. A logger that throws is ignored: logging
 * never changes what the guard does.
 */
export function logWith(logger) {
  if (logger === undefined || logger === null) return null;
  if (typeof logger !== 'object' && typeof logger !== 'function') throw new TypeError('logger: expected an object with debug/info/warn/error methods');
  if (!LEVELS.some((level) => typeof logger[level] === 'function'))
    throw new TypeError('logger: expected at least one of debug, info, warn, error as a method');
  return (level, message, fields) => {
    const method = logger[level];
    if (typeof method !== 'function') return;
    try {
      method.call(logger, message, fields);
    } catch {
      // Logging never changes the outcome.
    }
  };
}
