//! What an operator sees of `idem serve` after the fact: its log lines (one
//! per guarded request, store failures, operators' actions), the audit
//! events on `/v1/events` and a key's history — for one scripted sequence
//! on one key: a new key, a replay, a conflict, an expiry by an operator, a
//! fault, the 503 it causes, a release by an operator and the takeover the
//! release lets through.

use crate::support::{each_str, http, serve, spawn_ledger};
use idem_harness::{Lines, Proc, spawn_logged};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The order the script sends for `key`: `qty` 1, or another payload.
pub(crate) fn order(key: &str, qty: u32) -> String {
    format!(r#"{{"order":"{key}","sku":"A","qty":{qty},"cents":1000}}"#)
}

/// The store key of `key` sent without a client header: `anon/KEY`,
/// percent-encoded as one path segment of the admin API.
pub(crate) fn admin_path(key: &str) -> String {
    format!("/v1/keys/anon%2F{key}")
}

/// The scripted sequence on `key`, through the proxy at `proxy` and the
/// admin API at `admin`; the statuses it got, in order:
/// 1. a new key: 201; 2. the same again: a replay, 201;
/// 3. another payload: a conflict, 422; 4. the operator expires the key;
/// 5. the operator sets `insert` to lose its next reply (`1*lost`);
/// 6. the same order again: its claim is written but the reply is lost, so
///    the gateway fails closed, 503, and the key is held by a claim no one runs;
/// 7. the operator releases it; 8. the order again: it takes the key
///    over (fence above 1) and runs, 201.
pub(crate) async fn script(proxy: u16, admin: u16, key: &str) -> Vec<u16> {
    let mut statuses = script_to_503(proxy, admin, key).await;
    let path = format!("{}/release", admin_path(key));
    statuses.push(http(admin, "POST", &path, &[], "").await.status);
    statuses.push(place(proxy, key, 1).await);
    statuses
}

/// Steps 1 to 6 of [`script`]: up to the 503 that leaves the key held by
/// a claim no one runs.
pub(crate) async fn script_to_503(proxy: u16, admin: u16, key: &str) -> Vec<u16> {
    let act = |method: &'static str, path: String, body: &'static str| async move {
        http(admin, method, &path, &[], body).await.status
    };
    vec![
        place(proxy, key, 1).await,
        place(proxy, key, 1).await,
        place(proxy, key, 2).await,
        act("POST", format!("{}/expire", admin_path(key)), "").await,
        act(
            "PUT",
            "/v1/faults".into(),
            r#"{"faults":{"insert":{"kind":"lost","count":1}}}"#,
        )
        .await,
        place(proxy, key, 1).await,
    ]
}

/// `POST /orders` of [`order`] `qty` under `key`: the status.
pub(crate) async fn place(proxy: u16, key: &str, qty: u32) -> u16 {
    let headers = [
        ("Idempotency-Key", key),
        ("Content-Type", "application/json"),
    ];
    http(proxy, "POST", "/orders", &headers, &order(key, qty))
        .await
        .status
}

/// The statuses [`script`] gets.
pub(crate) const SCRIPTED: [u16; 8] = [201, 201, 422, 200, 200, 503, 200, 201];

/// `/v1/events` read from the start of the script: each event's name and data.
struct Events(Arc<Mutex<Vec<(String, Value)>>>);

impl Events {
    /// Subscribes: returns once the gateway answered the stream's head, so
    /// every event after this is seen.
    async fn subscribe(admin: u16) -> Events {
        let mut stream = TcpStream::connect(("127.0.0.1", admin)).await.unwrap();
        stream
            .write_all(
                b"GET /v1/events HTTP/1.0\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n",
            )
            .await
            .unwrap();
        let mut lines = BufReader::new(stream).lines();
        // The head, up to its blank line.
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.is_empty() {
                break;
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        tokio::spawn(async move {
            let mut name = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                // HTTP/1.0: the body runs to the close, no chunk framing.
                if let Some(event) = line.strip_prefix("event: ") {
                    name = event.to_owned();
                } else if let Some(data) = line.strip_prefix("data: ") {
                    let data = serde_json::from_str(data).unwrap();
                    into.lock().unwrap().push((std::mem::take(&mut name), data));
                }
            }
        });
        Events(seen)
    }

    /// The events, once `pred` holds on them (40 s at most).
    async fn wait_for(
        &self,
        what: &str,
        pred: impl Fn(&[(String, Value)]) -> bool,
    ) -> Vec<(String, Value)> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let events = self.0.lock().unwrap().clone();
            if pred(&events) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `idem serve` (memory store, JSON logs at the default level) in front of
/// `idem ledger`: both processes, the proxy and admin ports, and the log.
fn serve_logged(extra: &[&str]) -> (Proc, Proc, u16, u16, Lines) {
    let (ledger, ledger_port) = spawn_ledger(&[]);
    let mut idem = serve("127.0.0.1:0");
    idem.args([
        "--store",
        "memory:",
        "--log-format",
        "json",
        "--name",
        "gw-observed",
    ])
    .args(["--upstream", &format!("http://127.0.0.1:{ledger_port}")])
    .args(extra)
    .env_remove("RUST_LOG")
    .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
    .env_remove("OTEL_TRACES_EXPORTER");
    let (serve, [proxy, admin], log) =
        spawn_logged(idem, ["idem serve: http://", "admin API: http://"]);
    (ledger, serve, proxy, admin, log)
}

/// The log's JSON lines of `target`, for `key` when they name one.
fn records(lines: &[String], target: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|r| r["target"] == target)
        .collect()
}

fn is_peer(by: &Value) -> bool {
    by.as_str().is_some_and(|by| {
        by.strip_prefix("127.0.0.1:")
            .is_some_and(|port| port.parse::<u16>().is_ok())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_log_the_audit_events_and_the_history_tell_a_keys_story() {
    let (_ledger, _serve, proxy, admin, log) = tokio::task::spawn_blocking(|| serve_logged(&[]))
        .await
        .unwrap();
    let events = Events::subscribe(admin).await;
    let key = idem_harness::unique("observed");
    let statuses = script(proxy, admin, &key).await;
    assert_eq!(statuses, SCRIPTED, "the script's answers");
    let store_key = format!("anon/{key}");

    // One line per guarded request, with the documented fields, in order.
    let lines = log.wait_for("five decisions logged", |lines| {
        records(lines, "idem::request")
            .iter()
            .filter(|r| r["key"] == store_key.as_str())
            .count()
            == 5
    });
    let decisions: Vec<Value> = records(&lines, "idem::request")
        .into_iter()
        .filter(|r| r["key"] == store_key.as_str())
        .collect();
    let summary: Vec<(&str, u64)> = decisions
        .iter()
        .map(|d| {
            (
                d["decision"].as_str().unwrap(),
                d["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("executed", 201),
            ("replayed", 201),
            ("conflict", 422),
            ("unavailable", 503),
            ("executed", 201)
        ],
        "{decisions:#?}"
    );
    for d in &decisions {
        assert_eq!(
            (d["level"].as_str(), d["message"].as_str()),
            (Some("INFO"), Some("decided")),
            "{d}"
        );
        assert!(
            d["latency_us"].is_u64() && d["timestamp"].is_string(),
            "{d}"
        );
    }
    assert_eq!(
        decisions[0]["fence"], 1,
        "a new key's first claim: {}",
        decisions[0]
    );
    assert!(
        decisions[1].get("fence").is_none(),
        "a replay claims nothing: {}",
        decisions[1]
    );
    let reason = decisions[3]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("lost") && reason.contains("insert") && reason.contains(&key),
        "the 503's full reason: {reason:?}"
    );
    assert!(
        decisions[4]["fence"].as_u64().is_some_and(|f| f > 1),
        "the takeover after the release claims above the first fence: {}",
        decisions[4]
    );

    // The store's failure at warn, with the key and the injected error.
    let failures = records(&lines, "idem::store");
    assert!(
        failures.iter().any(|f| f["level"] == "WARN"
            && f["op"] == "insert"
            && f["key"] == store_key.as_str()
            && f["error"].as_str().is_some_and(|e| e.contains("lost"))),
        "{failures:#?}"
    );

    // Every operator's action: what, when, from where.
    let audit = records(&lines, "idem::admin");
    let actions: Vec<&str> = audit
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["expire", "fault", "release"], "{audit:#?}");
    for a in &audit {
        assert!(is_peer(&a["by"]) && a["timestamp"].is_string(), "{a}");
    }
    assert_eq!(audit[0]["key"], store_key.as_str());
    assert_eq!(
        (audit[1]["op"].as_str(), audit[1]["rule"].as_str()),
        (Some("insert"), Some("1*lost"))
    );
    assert_eq!(audit[2]["key"], store_key.as_str());

    // The same on /v1/events: decisions, the store error, the audit events.
    let seen = events
        .wait_for("the script's events", |e| {
            e.iter()
                .filter(|(name, data)| name == "decision" && data["key"] == store_key.as_str())
                .count()
                == 5
                && e.iter().any(|(name, _)| name == "admin")
        })
        .await;
    let story: Vec<String> = seen
        .iter()
        .filter(|(_, data)| data.get("key").is_none_or(|k| *k == store_key.as_str()))
        .map(|(name, data)| match name.as_str() {
            "decision" => format!("decision {}", data["outcome"].as_str().unwrap()),
            "admin" => format!("admin {}", data["action"].as_str().unwrap()),
            "fault" => format!("fault {}", data["kind"].as_str().unwrap()),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(
        story,
        [
            "decision executed",
            "decision replayed",
            "decision conflict",
            "admin expire",
            "fault lost",
            "store_error",
            "decision unavailable",
            "admin release",
            "decision executed",
        ],
        "{seen:#?}"
    );
    for (name, data) in &seen {
        if name == "admin" || name == "fault" {
            assert!(is_peer(&data["by"]), "{name}: {data}");
        }
    }

    // And the key's history, kept by the gateway: the same story.
    let history = http(
        admin,
        "GET",
        &format!("{}/history", admin_path(&key)),
        &[],
        "",
    )
    .await
    .json();
    assert_eq!(
        each_str(&history["events"], "event"),
        [
            "decision",
            "decision",
            "decision",
            "admin",
            "fault",
            "store_error",
            "decision",
            "admin",
            "decision"
        ],
        "{history:#}"
    );
    assert_eq!(history["kept"], 10_000);
}

/// The log's lines gather on a writer thread for a few milliseconds before
/// they are written: a gateway stopped by SIGTERM right after its last
/// request still writes every request's line, before its last line.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_stopped_by_sigterm_writes_every_line_first() {
    let (_ledger, mut serve, proxy, _admin, log) =
        tokio::task::spawn_blocking(|| serve_logged(&[]))
            .await
            .unwrap();
    let run = idem_harness::unique("stopping");
    let sent = 200;
    for i in 0..sent {
        assert_eq!(place(proxy, &format!("{run}-{i}"), 1).await, 201);
    }
    // At once: the last lines are still gathering.
    let pid = serve.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || serve.0.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "idem serve exited with {status}");
    let lines = log.wait_for("idem serve: stopped", |lines| {
        lines.last().is_some_and(|l| l == "idem serve: stopped")
    });
    let logged = records(&lines, "idem::request")
        .iter()
        .filter(|r| {
            r["key"]
                .as_str()
                .is_some_and(|k| k.starts_with(&format!("anon/{run}-")))
        })
        .count();
    assert_eq!(
        logged, sent,
        "every request's line written before the gateway stopped"
    );
}
