//! `idem serve`'s OpenTelemetry traces, received as a collector receives
//! them: an OTLP/HTTP receiver in the test decodes the protobuf the gateway
//! exports (configured by nothing but the standard `OTEL_*` variables), and
//! an upstream in the test records the `traceparent` each request brought.

use crate::observe::{SCRIPTED, script};
use crate::support::{http, serve};
use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use idem_harness::spawn_bound;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};
use prost::Message as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// A span as received, with the resource it came from.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<Any> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone()?.value)
    }

    fn text(&self, key: &str) -> Option<String> {
        match self.attr(key)? {
            Any::StringValue(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            Any::IntValue(n) => Some(n),
            _ => None,
        }
    }

    fn failed(&self) -> Option<String> {
        self.span
            .status
            .as_ref()
            .filter(|s| s.code == StatusCode::Error as i32)
            .map(|s| s.message.clone())
    }
}

/// Starts an OTLP/HTTP receiver on port 0: `POST /v1/traces` with an
/// `ExportTraceServiceRequest` in protobuf.
async fn receiver() -> (u16, Arc<Mutex<Vec<Received>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let into = spans.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: Bytes| async move {
            assert_eq!(
                headers.get("content-type").unwrap(),
                "application/x-protobuf",
                "OTLP/HTTP in protobuf"
            );
            let request = ExportTraceServiceRequest::decode(body).expect("a valid export");
            let mut spans = into.lock().unwrap();
            for resource in request.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| match kv.value.clone()?.value? {
                        Any::StringValue(s) => Some(s),
                        _ => None,
                    })
                    .unwrap_or_default();
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        spans.push(Received {
                            service: service.clone(),
                            span,
                        });
                    }
                }
            }
            (
                [("content-type", "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, spans)
}

/// An upstream that answers every order 201 and keeps the `traceparent`
/// each brought (`""` for none).
async fn upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    let app = Router::new().route(
        "/orders",
        post(move |headers: HeaderMap| async move {
            let parent = headers
                .get("traceparent")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            into.lock().unwrap().push(parent);
            (axum::http::StatusCode::CREATED, r#"{"placed":true}"#)
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_exports_a_span_per_request_with_its_store_calls_and_passes_the_trace_upstream()
{
    let (otlp, spans) = receiver().await;
    let (upstream, parents) = upstream().await;
    let mut idem = serve("127.0.0.1:0");
    idem.args(["--store", "memory:"])
        .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let (_serve, [proxy, admin]) = tokio::task::spawn_blocking(move || {
        spawn_bound(idem, ["idem serve: http://", "admin API: http://"])
    })
    .await
    .unwrap();

    // A request that brings a trace of its own, then the scripted sequence.
    let (trace, caller) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traced = idem_harness::unique("traced");
    let traceparent = format!("00-{trace}-{caller}-01");
    let headers = [
        ("Idempotency-Key", traced.as_str()),
        ("traceparent", traceparent.as_str()),
    ];
    let reply = http(proxy, "POST", "/orders", &headers, "{}").await;
    assert_eq!(reply.status, 201);
    let key = idem_harness::unique("spans");
    assert_eq!(script(proxy, admin, &key).await, SCRIPTED);

    // Six request spans: the traced one and the script's five guarded requests.
    let deadline = Instant::now() + Duration::from_secs(40);
    let received = loop {
        let received = spans.lock().unwrap().clone();
        let requests = received
            .iter()
            .filter(|r| r.span.name == "idem.request")
            .count();
        if requests == 6 {
            break received;
        }
        assert!(
            Instant::now() < deadline,
            "{requests} request spans: {received:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(received.iter().all(|r| r.service == "idem"), "service.name");
    let children = |of: &Received| -> Vec<Received> {
        let mut c: Vec<Received> = received
            .iter()
            .filter(|r| {
                r.span.parent_span_id == of.span.span_id && r.span.trace_id == of.span.trace_id
            })
            .cloned()
            .collect();
        c.sort_by_key(|r| r.span.start_time_unix_nano);
        c
    };
    let names = |spans: &[Received]| {
        spans
            .iter()
            .map(|r| r.span.name.clone())
            .collect::<Vec<_>>()
    };

    // The caller's trace continues through the gateway and on upstream.
    let first = received
        .iter()
        .find(|r| {
            r.span.name == "idem.request" && r.text("idem.key") == Some(format!("anon/{traced}"))
        })
        .expect("the traced request's span");
    assert_eq!(
        (hex(&first.span.trace_id), hex(&first.span.parent_span_id)),
        (trace.to_owned(), caller.to_owned()),
        "the server span continues the caller's trace"
    );
    let up = children(first)
        .into_iter()
        .find(|c| c.span.name == "idem.upstream")
        .expect("an upstream span");
    assert_eq!(
        parents.lock().unwrap()[0],
        format!("00-{trace}-{}-01", hex(&up.span.span_id)),
        "the upstream got the trace, its parent the upstream span"
    );

    // The script's requests, in order: decision, replay or not, fence,
    // status, reason, and the store calls each made.
    let mut script_spans: Vec<Received> = received
        .iter()
        .filter(|r| {
            r.span.name == "idem.request" && r.text("idem.key") == Some(format!("anon/{key}"))
        })
        .cloned()
        .collect();
    script_spans.sort_by_key(|r| r.span.start_time_unix_nano);
    let decisions: Vec<(String, bool, i64)> = script_spans
        .iter()
        .map(|r| {
            (
                r.text("idem.decision").unwrap(),
                r.attr("idem.replayed") == Some(Any::BoolValue(true)),
                r.int("http.response.status_code").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("executed".into(), false, 201),
            ("replayed".into(), true, 201),
            ("conflict".into(), false, 422),
            ("unavailable".into(), false, 503),
            ("executed".into(), false, 201),
        ]
    );
    let [new, replay, conflict, failed, takeover] = &script_spans[..] else {
        unreachable!()
    };
    assert_eq!(new.int("idem.fence"), Some(1));
    assert!(
        takeover.int("idem.fence").is_some_and(|f| f > 1),
        "{takeover:?}"
    );
    assert_eq!(replay.int("idem.fence"), None);
    assert_eq!(
        names(&children(new)),
        ["idem.store.insert", "idem.upstream", "idem.store.replace"],
        "a new key: the claim, the upstream call, the completion"
    );
    assert_eq!(names(&children(replay)), ["idem.store.insert"]);
    assert_eq!(names(&children(conflict)), ["idem.store.insert"]);
    let insert = &children(new)[0];
    assert_eq!(insert.text("db.system.name").as_deref(), Some("memory"));
    assert_eq!(insert.text("db.operation.name").as_deref(), Some("insert"));
    assert!(insert.int("idem.store.latency_us").is_some());
    assert!(insert.span.end_time_unix_nano >= insert.span.start_time_unix_nano);
    // The 503: its reason on the request span, the store's error on its call.
    let reason = failed.text("idem.reason").unwrap_or_default();
    assert!(reason.contains("lost"), "{reason}");
    assert!(failed.failed().is_some(), "a 5xx is an error span");
    let failed_insert = children(failed);
    assert_eq!(names(&failed_insert), ["idem.store.insert"]);
    assert!(
        failed_insert[0]
            .failed()
            .is_some_and(|m| m.contains("lost")),
        "{failed_insert:?}"
    );
    assert!(new.failed().is_none() && conflict.failed().is_none());
    // Every upstream call brought the trace of its request.
    let parents = parents.lock().unwrap().clone();
    assert_eq!(parents.len(), 3, "three executions: {parents:?}");
    assert!(
        parents
            .iter()
            .all(|p| p.starts_with("00-") && p.ends_with("-01")),
        "{parents:?}"
    );
}

/// Off (no `OTEL_*` variable), the gateway sends a caller's `traceparent`
/// upstream as it came, like any other header, and exports nothing.
#[tokio::test(flavor = "multi_thread")]
async fn without_otel_variables_a_traceparent_passes_through_untouched() {
    let (upstream, parents) = upstream().await;
    let mut idem = serve("off");
    idem.args(["--store", "memory:"])
        .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_TRACES_EXPORTER");
    let (_serve, [proxy]) =
        tokio::task::spawn_blocking(move || spawn_bound(idem, ["idem serve: http://"]))
            .await
            .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let key = idem_harness::unique("untraced");
    let headers = [
        ("Idempotency-Key", key.as_str()),
        ("traceparent", traceparent),
    ];
    assert_eq!(
        http(proxy, "POST", "/orders", &headers, "{}").await.status,
        201
    );
    assert_eq!(parents.lock().unwrap().clone(), [traceparent]);
}

/// A trace exporter the gateway cannot run is refused at start, named.
#[test]
fn an_unsupported_otel_setting_is_refused_naming_it() {
    for (var, value, says) in [
        (
            "OTEL_TRACES_EXPORTER",
            "zipkin",
            "OTEL_TRACES_EXPORTER=\"zipkin\"",
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "OTLP protocol \"grpc\"",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://collector:4318",
            "only http://",
        ),
    ] {
        let out = serve("off")
            .args(["--store", "memory:", "--upstream", "http://127.0.0.1:1"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}={value}: {stderr}");
        assert!(stderr.contains(says), "{var}={value}: {stderr}");
    }
}
