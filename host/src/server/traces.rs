//! OpenTelemetry traces of the gateway: a server span per guarded request,
//! a child span per store call and one for the upstream call, whose W3C
//! trace context (`traceparent`, `tracestate`) goes upstream with the request.
//! A request that brings a `traceparent` continues that trace.
//!
//! Off unless a tracer is given ([`super::GatewayBuilder::tracer`]; `idem
//! serve` builds one from the standard `OTEL_*` variables). Off, the
//! gateway makes no span, reads no context and pays one branch per
//! request; the trace headers a client sent go upstream untouched, as
//! every other header does.
//!
//! The request span (`idem.request`, kind server) carries:
//! `http.request.method`, `url.path`, `http.response.status_code`,
//! `idem.key` (the store key), `idem.decision` (the admin API's outcome),
//! `idem.replayed` (bool), `idem.fence` (when the request claimed the key)
//! and `idem.reason` (the full reason of a refusal); its status is an
//! error for a 5xx. The store calls' spans (`idem.store.get`, `.insert`,
//! `.replace`, `.delete`, kind client) carry `db.system.name` (the store),
//! `db.operation.name` and `idem.store.latency_us`, and an error status
//! with the store's message when the call failed. The upstream span
//! (`idem.upstream`, kind client) carries `http.request.method`,
//! `idem.fence` and the upstream's `http.response.status_code`.

use super::events::Verdict;
use crate::store::{Op, StoreError};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use std::borrow::Cow;
use std::time::{Duration, SystemTime};

/// The gateway's tracer and the W3C propagator.
pub struct Traces {
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    /// `db.system.name` of the store spans.
    store: &'static str,
}

impl Traces {
    pub(crate) fn new(tracer: SdkTracer, store: &'static str) -> Traces {
        Traces {
            tracer,
            propagator: TraceContextPropagator::new(),
            store: db_system(store),
        }
    }

    /// Starts the server span of a guarded request, as a child of the
    /// caller's `traceparent` if it sent a valid one; the context to run
    /// the request in.
    pub(crate) fn request<B>(&self, req: &Request<B>) -> Context {
        let parent = self
            .propagator
            .extract_with_context(&Context::new(), &Headers(req.headers()));
        let span = self
            .tracer
            .span_builder("idem.request")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", req.method().as_str().to_owned()),
                KeyValue::new("url.path", req.uri().path().to_owned()),
            ])
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Ends the request's span with the status answered.
    pub(crate) fn responded(cx: &Context, status: u16) {
        let span = cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_status(Status::error(format!("answered {status}")));
        }
        span.end();
    }

    /// What the gateway decided, on the current request's span.
    pub(crate) fn decided(verdict: Verdict, key: &str, fence: Option<u64>, reason: Option<&str>) {
        let cx = Context::current();
        let span = cx.span();
        let mut attributes = vec![
            KeyValue::new("idem.key", key.to_owned()),
            KeyValue::new("idem.decision", verdict.as_str()),
            KeyValue::new("idem.replayed", verdict == Verdict::Replayed),
        ];
        if let Some(fence) = fence {
            attributes.push(KeyValue::new("idem.fence", fence.cast_signed()));
        }
        if let Some(reason) = reason {
            attributes.push(KeyValue::new("idem.reason", reason.to_owned()));
        }
        span.set_attributes(attributes);
    }

    /// Starts the upstream call's span, a child of the current request's,
    /// and puts its trace context in `headers` (replacing the caller's).
    pub(crate) fn upstream(&self, method: &str, fence: u64, headers: &mut HeaderMap) -> Context {
        let cx = Context::current();
        let span = self
            .tracer
            .span_builder("idem.upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", method.to_owned()),
                KeyValue::new("idem.fence", fence.cast_signed()),
            ])
            .start_with_context(&self.tracer, &cx);
        let cx = cx.with_span(span);
        self.propagator
            .inject_context(&cx, &mut HeadersMut(headers));
        cx
    }

    /// Ends the upstream call's span: the status it answered, or why it failed.
    pub(crate) fn upstream_done(cx: &Context, answered: Result<u16, String>) {
        let span = cx.span();
        match answered {
            Ok(status) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 500 {
                    span.set_status(Status::error(format!("upstream answered {status}")));
                }
            }
            Err(why) => span.set_status(Status::error(why)),
        }
        span.end();
    }

    /// A finished store call, as a child span of the current request's
    /// (none outside a request: the purger's, the admin API's).
    pub(crate) fn store_call(&self, op: Op, took: Duration, outcome: Result<(), &StoreError>) {
        let cx = Context::current();
        if !cx.has_active_span() {
            return;
        }
        let end = SystemTime::now();
        let mut span = self
            .tracer
            .span_builder(store_span_name(op))
            .with_kind(SpanKind::Client)
            .with_start_time(end.checked_sub(took).unwrap_or(end))
            .with_attributes([
                KeyValue::new("db.system.name", self.store),
                KeyValue::new("db.operation.name", op.as_str()),
                KeyValue::new("idem.store.latency_us", took.as_micros() as i64),
            ])
            .start_with_context(&self.tracer, &cx);
        if let Err(e) = outcome {
            span.set_status(Status::Error {
                description: Cow::Owned(e.to_string()),
            });
        }
        span.end_with_timestamp(end);
    }
}

fn store_span_name(op: Op) -> &'static str {
    match op {
        Op::Get => "idem.store.get",
        Op::Insert => "idem.store.insert",
        Op::Replace => "idem.store.replace",
        Op::Delete => "idem.store.delete",
    }
}

/// The OpenTelemetry name of a store (`db.system.name`).
fn db_system(store: &'static str) -> &'static str {
    match store {
        "postgres" => "postgresql",
        "dynamodb" => "aws.dynamodb",
        other => other,
    }
}

/// A request's headers, read by the propagator.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The upstream request's headers, written by the propagator.
struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}
