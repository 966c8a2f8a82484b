//! The admin API against its contract: a real gateway over real HTTP (the
//! harness of `gateway.rs`), every
//! endpoint called, every answer decoded into the `idem-admin-api` type the
//! console decodes it into. Each decoded value must serialize back to the
//! very JSON the server sent (no field lost, added or renamed), and each
//! object must have the fields the API has always had, and no others:
//! others rely on them.

use crate::gateway::{Harness, start};
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use idem::server::Config;
use idem_admin_api as api;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeSet;

/// Today's fields, object by object.
const KEY_INFO: &[&str] = &[
    "key",
    "state",
    "fence",
    "version",
    "lease_until_ms",
    "lease_remaining_ms",
    "expires_at_ms",
    "expires_in_ms",
    "fingerprint",
    "status",
    "replays",
    // Issue 47: who holds the claim.
    "holder",
    "held_here",
];
const KEY_PAGE: &[&str] = &["now_ms", "keys", "next", "total"];
const STORED_RESPONSE: &[&str] = &[
    "status",
    "headers",
    "body_bytes",
    "body_preview",
    "body_base64",
];
const FAULTS: &[&str] = &["faults", "injected"];
const FAULT_SET: &[&str] = &["get", "insert", "replace", "delete"];
const FAULT_RULE: &[&str] = &["kind", "latency_ms", "probability", "count", "message"];
const STATS: &[&str] = &[
    "uptime_ms",
    "store",
    "outcomes",
    "rates_per_s",
    "store_latency_us",
    "pool",
    "purge",
    "clock",
    "store_connection",
    "slots",
    "gateway",
];
const CLOCK: &[&str] = &[
    "authority",
    "now_ms",
    "error_ms",
    "unknown",
    "wall_offset_ms",
];
const STORE_CONNECTION: &[&str] = &["state", "since_ms", "attempts", "last_error"];
const SLOTS: &[&str] = &["guarded", "unguarded"];
const SLOT_USE: &[&str] = &["in_use", "limit", "refused"];
const GATEWAY_INFO: &[&str] = &["name", "listen", "version"];
const KEY_HISTORY: &[&str] = &["key", "events", "kept", "since_ms"];
const OUTCOMES: &[&str] = &[
    "executed",
    "replayed",
    "in_flight",
    "conflict",
    "unavailable",
    "invalid",
];
const LATENCY: &[&str] = &["p50", "p90", "p99", "max"];
const POOL: &[&str] = &["instantiated", "failed", "idle", "in_use"];
const PURGE: &[&str] = &[
    "runs",
    "purged",
    "errors",
    "last_purged",
    "last_took_us",
    "last_error",
    "every_ms",
];
const PROBLEM: &[&str] = &["type", "title", "status", "detail"];
const DECISION_EVENT: &[&str] = &[
    "ts_ms",
    "key",
    "outcome",
    "status",
    "latency_us",
    "detail",
    "fence",
];
const FAULT_EVENT: &[&str] = &[
    "ts_ms",
    "op",
    "kind",
    "latency_ms",
    "probability",
    "count",
    "message",
    "by",
];
const ADMIN_EVENT: &[&str] = &["ts_ms", "action", "key", "by", "fence", "version"];

/// The fields of the event named `name`.
fn event_fields(name: &str) -> &'static [&'static str] {
    match name {
        "decision" => DECISION_EVENT,
        "fault" => FAULT_EVENT,
        "admin" => ADMIN_EVENT,
        other => panic!("an event this test does not expect: {other}"),
    }
}

fn fields(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

#[track_caller]
fn assert_fields(value: &Value, expected: &[&str]) {
    assert_eq!(
        fields(value),
        expected.iter().copied().collect(),
        "the fields of {value}"
    );
}

/// `T` decoded from the server's JSON; it must serialize back to that JSON.
#[track_caller]
fn decode<T: DeserializeOwned + Serialize>(json: &Value) -> T {
    let typed: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("does not decode as the contract's type ({e}): {json}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        json,
        "the contract's type changes the server's JSON"
    );
    typed
}

/// An admin call: its status and its JSON body (`null` when empty).
async fn admin(h: &Harness, method: &str, path: &str, body: &str) -> (u16, Value) {
    let reply = h
        .admin(method, path, &[("content-type", "application/json")], body)
        .await;
    if reply.status >= 400 {
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
    }
    let json = if reply.body.is_empty() {
        Value::Null
    } else {
        reply.json()
    };
    (reply.status, json)
}

#[track_caller]
fn problem(status_and_body: &(u16, Value), status: u16) -> api::Problem {
    assert_eq!(status_and_body.0, status, "{}", status_and_body.1);
    assert_fields(&status_and_body.1, PROBLEM);
    let problem: api::Problem = decode(&status_and_body.1);
    assert_eq!(
        (problem.status, problem.kind.as_str()),
        (status, "about:blank")
    );
    problem
}

#[tokio::test]
async fn every_admin_answer_decodes_into_the_contract_with_todays_fields() {
    let h = start(Config::default()).await;

    // Faults: set one, read them back; a bad rule is refused, naming it.
    let (status, put) = admin(
        &h,
        "PUT",
        "/v1/faults",
        r#"{"faults":{"delete":{"kind":"delay","latency_ms":3,"probability":0.5,"count":2}}}"#,
    )
    .await;
    assert_eq!(status, 200, "{put}");
    let (_, got) = admin(&h, "GET", "/v1/faults", "").await;
    assert_eq!(put, got);
    assert_fields(&got, FAULTS);
    assert_fields(&got["faults"], FAULT_SET);
    assert_fields(&got["faults"]["delete"], FAULT_RULE);
    let faults: api::Faults = decode(&got);
    assert_eq!(
        faults.faults.rule(api::Op::Delete).to_string(),
        "50%2*delay(3)"
    );
    let refused = admin(
        &h,
        "PUT",
        "/v1/faults",
        r#"{"faults":{"insert":{"kind":"lost","probability":1.5}}}"#,
    )
    .await;
    let why = problem(&refused, 400).detail;
    assert!(
        why.starts_with("faults.insert: probability 1.5 is outside 0 to 1"),
        "{why}"
    );

    // The event stream, opened before any traffic.
    let events = Request::get(format!("http://{}/v1/events", h.admin))
        .body(Body::empty())
        .unwrap();
    let mut stream = h.client.request(events).await.unwrap().into_body();

    // A done key (replayed once), and one in flight.
    let order = r#"{"order":"o-1","sku":"A","qty":1,"cents":700}"#;
    assert_eq!(h.post("/orders", "contract-done", order).await.status, 201);
    assert_eq!(h.post("/orders", "contract-done", order).await.status, 201);
    let mut h = h;
    let held = h.slow_held("contract-held").await;
    let (_, processing) = admin(&h, "GET", "/v1/keys?state=processing", "").await;
    admin(
        &h,
        "PUT",
        "/v1/faults",
        r#"{"faults":{"delete":{"kind":"off"}}}"#,
    )
    .await;

    // Keys: the store's own order, a sorted scan, a search; a bad query.
    let (status, page) = admin(&h, "GET", "/v1/keys?limit=1", "").await;
    assert_eq!(status, 200);
    assert_fields(&page, KEY_PAGE);
    assert_fields(&page["keys"][0], KEY_INFO);
    let page: api::KeyPage = decode(&page);
    assert_eq!((page.keys.len(), page.total), (1, None));
    assert!(page.next.is_some(), "a second key is left");
    let (_, sorted) = admin(&h, "GET", "/v1/keys?sort=replays&order=desc&limit=10", "").await;
    let sorted: api::KeyPage = decode(&sorted);
    assert_eq!(sorted.total, Some(2));
    assert_eq!(
        (sorted.keys[0].key.as_str(), sorted.keys[0].replays),
        ("anon/contract-done", 1)
    );
    let (_, found) = admin(&h, "GET", "/v1/keys?search=HELD", "").await;
    let found: api::KeyPage = decode(&found);
    assert_eq!(found.keys.len(), 1);
    let held_info = decode::<api::KeyPage>(&processing).keys.remove(0);
    assert_eq!(found.keys[0].key, held_info.key);
    assert_eq!(held_info.state, api::KeyState::Processing);
    let bad = admin(&h, "GET", "/v1/keys?state=finished", "").await;
    assert_eq!(
        problem(&bad, 400).detail,
        "state \"finished\" is not processing or done"
    );

    // One key: done with its response, in flight without; a missing one.
    let (status, done) = admin(&h, "GET", "/v1/keys/anon%2Fcontract-done", "").await;
    assert_eq!(status, 200);
    let mut expected: Vec<&str> = KEY_INFO.to_vec();
    expected.push("response");
    assert_fields(&done, &expected);
    assert_fields(&done["response"], STORED_RESPONSE);
    let done: api::KeyDetail = decode(&done);
    let response = done.response.unwrap();
    assert_eq!(
        (done.info.state, response.status),
        (api::KeyState::Done, 201)
    );
    assert!(response.body_preview.contains("o-1"), "{response:?}");
    let (_, in_flight) = admin(&h, "GET", "/v1/keys/anon%2Fcontract-held", "").await;
    assert_eq!(in_flight["response"], Value::Null);
    let in_flight: api::KeyDetail = decode(&in_flight);
    assert_eq!(in_flight.info, held_info_now(&in_flight.info, &held_info));
    let missing = admin(&h, "GET", "/v1/keys/anon%2Fnever", "").await;
    problem(&missing, 404);

    // Operator actions.
    let (status, released) = admin(&h, "POST", "/v1/keys/anon%2Fcontract-held/release", "").await;
    assert_eq!(status, 200, "{released}");
    assert_fields(&released, KEY_INFO);
    let released: api::KeyInfo = decode(&released);
    assert_eq!(released.lease_remaining_ms, 0);
    let not_held = admin(&h, "POST", "/v1/keys/anon%2Fcontract-done/release", "").await;
    problem(&not_held, 409);
    let (status, expired) = admin(&h, "POST", "/v1/keys/anon%2Fcontract-done/expire", "").await;
    assert_eq!(status, 200, "{expired}");
    let expired: api::KeyInfo = decode(&expired);
    assert_eq!(expired.expires_in_ms, 0);
    let (status, deleted) = admin(&h, "DELETE", "/v1/keys/anon%2Fcontract-held", "").await;
    assert_eq!((status, deleted), (204, Value::Null));

    // A key's history: its decisions, the fault change made meanwhile and
    // the operator's expiry, each event tagged with its name.
    let (status, history) = admin(&h, "GET", "/v1/keys/anon%2Fcontract-done/history", "").await;
    assert_eq!(status, 200);
    assert_fields(&history, KEY_HISTORY);
    for event in history["events"].as_array().unwrap() {
        let name = event["event"].as_str().unwrap();
        let mut expected = event_fields(name).to_vec();
        expected.push("event");
        assert_fields(event, &expected);
    }
    let history: api::KeyHistory = decode(&history);
    let names: Vec<&str> = history.events.iter().map(api::Event::name).collect();
    assert_eq!(
        names,
        ["decision", "decision", "fault", "admin"],
        "{history:?}"
    );

    // Stats.
    let (status, stats) = admin(&h, "GET", "/v1/stats", "").await;
    assert_eq!(status, 200);
    assert_fields(&stats, STATS);
    for counters in ["outcomes", "rates_per_s"] {
        assert_fields(&stats[counters], OUTCOMES);
    }
    assert_fields(&stats["store_latency_us"], LATENCY);
    assert_fields(&stats["pool"], POOL);
    assert_fields(&stats["clock"], CLOCK);
    assert_fields(&stats["gateway"], GATEWAY_INFO);
    if !stats["purge"].is_null() {
        assert_fields(&stats["purge"], PURGE);
    }
    assert_fields(&stats["store_connection"], STORE_CONNECTION);
    assert_fields(&stats["slots"], SLOTS);
    for class in ["guarded", "unguarded"] {
        assert_fields(&stats["slots"][class], SLOT_USE);
    }
    let stats: api::Stats = decode(&stats);
    assert_eq!(
        stats.store_connection.state,
        api::ConnectionState::Connected
    );
    assert_eq!(
        (stats.slots.guarded.limit, stats.slots.unguarded.limit),
        (1024, 1024)
    );
    assert_eq!(
        (
            stats.store.as_str(),
            stats.outcomes.executed,
            stats.outcomes.replayed
        ),
        ("memory", 1, 1)
    );

    // The events since the stream opened: two decisions on the done key,
    // one fault change (the key in flight has no decision yet).
    let mut text = String::new();
    while text.matches("event: ").count() < 3 {
        let frame = stream.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let mut decoded = Vec::new();
    for event in text.split("\n\n").filter(|e| e.starts_with("event: ")) {
        let (head, data) = event.split_once("\ndata: ").unwrap();
        let name = head.strip_prefix("event: ").unwrap();
        let json: Value = serde_json::from_str(data).unwrap();
        assert_fields(&json, event_fields(name));
        let event = api::Event::decode(name, data)
            .unwrap_or_else(|| panic!("event {name} does not decode: {data}"));
        assert_eq!(event.name(), name);
        assert_eq!(event.data(), data, "the event's data, byte for byte");
        decoded.push(event);
    }
    let outcomes: Vec<_> = decoded
        .iter()
        .filter_map(|e| match e {
            api::Event::Decision(d) if d.key == "anon/contract-done" => Some(d.outcome),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, [api::Verdict::Executed, api::Verdict::Replayed]);
    assert!(
        decoded
            .iter()
            .any(|e| matches!(e, api::Event::Fault(f) if f.op == api::Op::Delete)),
        "{text}"
    );

    // Metrics: Prometheus text, every family named and typed.
    let metrics = h.admin("GET", "/metrics", &[], "").await;
    assert_eq!(metrics.status, 200);
    let content_type = metrics.header("content-type").unwrap();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    for family in [
        "idem_outcomes_total",
        "idem_store_latency_seconds",
        "idem_faults_injected_total",
        "idem_pool_instantiated_total",
        "idem_uptime_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family}:\n{text}"
        );
    }
    assert!(
        text.contains("idem_outcomes_total{outcome=\"replayed\"} 1"),
        "{text}"
    );

    h.upstream.go.add_permits(1);
    held.await.unwrap();
    h.shutdown().await;
}

/// `before` as it reads later: only the countdowns moved.
fn held_info_now(now: &api::KeyInfo, before: &api::KeyInfo) -> api::KeyInfo {
    api::KeyInfo {
        lease_remaining_ms: now.lease_remaining_ms,
        expires_in_ms: now.expires_in_ms,
        ..before.clone()
    }
}

/// The JSON the admin API sent before it had types (objects with their
/// keys sorted, as `serde_json::json!` wrote them), byte for byte.
#[test]
fn the_types_write_todays_bytes() {
    let problem = api::Problem::new(404, "Not Found", "no live record for key \"k\"");
    assert_eq!(
        serde_json::to_value(&problem).unwrap().to_string(),
        r#"{"detail":"no live record for key \"k\"","status":404,"title":"Not Found","type":"about:blank"}"#
    );
    let page = api::KeyPage {
        now_ms: 5,
        keys: vec![],
        next: None,
        total: None,
    };
    assert_eq!(
        serde_json::to_value(&page).unwrap().to_string(),
        r#"{"keys":[],"next":null,"now_ms":5,"total":null}"#
    );
    // What the console sends to set one rule.
    let set = api::SetFaults::one(api::Op::Insert, "lost".parse().unwrap());
    assert_eq!(
        serde_json::to_value(&set).unwrap(),
        serde_json::json!({"faults": {"insert": {"kind": "lost", "latency_ms": 0, "probability": 1.0, "count": null, "message": ""}}})
    );
}
