//! The admin API beside the gateway: fault injection, the token, the keys, the event stream and the metrics.

use super::*;

#[tokio::test]
async fn store_faults_set_through_the_admin_api_give_503_and_no_upstream_call() {
    let h = start(Config::default()).await;
    let put = h
        .put_faults(r#"{"faults":{"insert":{"kind":"error","message":"connection refused"}}}"#)
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    assert_eq!(put.json()["faults"]["insert"]["kind"], "error");
    assert_eq!(put.json()["faults"]["get"]["kind"], "off");

    let down = h.post("/orders", "o-down", &order("o-down", 1)).await;
    assert_problem(&down, 503, "store-unavailable");
    assert_eq!(down.header("retry-after"), Some("1"));
    assert!(down.detail().contains("connection refused"), "{down:?}");
    assert!(
        h.books().executions.is_empty(),
        "the upstream was never called"
    );

    let faults = h.admin_get("/v1/faults").await.json();
    assert_eq!(faults["injected"], 1);
    let stats = h.admin_get("/v1/stats").await.json();
    assert_eq!(stats["outcomes"]["unavailable"], 1);
    assert_eq!(stats["store"], "memory");

    let off = h
        .put_faults(r#"{"faults":{"insert":{"kind":"off"}}}"#)
        .await;
    assert_eq!(off.json()["faults"]["insert"]["kind"], "off");
    assert_eq!(
        h.post("/orders", "o-down", &order("o-down", 1))
            .await
            .status,
        201
    );
    assert_eq!(h.books().executions.get("o-down"), Some(&1));
    h.shutdown().await;
}

#[tokio::test]
async fn invalid_fault_rules_are_refused_naming_the_field_and_nothing_changes() {
    let h = start(Config::default()).await;
    let bad = h.put_faults(r#"{"faults":{"get":{"kind":"delay","latency_ms":5},"insert":{"kind":"error","probability":1.5}}}"#).await;
    assert_problem(&bad, 400, "about:blank");
    let detail = bad.detail();
    assert!(
        detail.contains("faults.insert") && detail.contains("outside 0 to 1"),
        "{detail}"
    );
    assert_eq!(
        h.admin_get("/v1/faults").await.json()["faults"]["get"]["kind"],
        "off",
        "all or nothing"
    );
    let unknown = h
        .put_faults(r#"{"faults":{"purge":{"kind":"error"}}}"#)
        .await;
    assert!(unknown.detail().contains("faults.purge"), "{unknown:?}");
    let kind = h
        .put_faults(r#"{"faults":{"get":{"kind":"explode"}}}"#)
        .await;
    assert_eq!(kind.status, 400);
    assert_eq!(h.put_faults("not json").await.status, 400);
    // A count of 0 would hit no call: refused, not fired once.
    let zero = h
        .put_faults(r#"{"faults":{"insert":{"kind":"error","count":0}}}"#)
        .await;
    assert_eq!(zero.status, 400, "{zero:?}");
    assert!(
        zero.detail().contains("count 0 would hit no call"),
        "{zero:?}"
    );
    assert_eq!(
        h.post("/orders", "o-count", &order("o-count", 1))
            .await
            .status,
        201
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_admin_token_is_enforced_and_required_off_loopback() {
    let h = start_with(Config::default(), Some("s3cret")).await;
    let none = h.admin_get("/v1/stats").await;
    assert_problem(&none, 401, "about:blank");
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    for (path, authorization, status) in [
        ("/v1/stats", "Bearer wrong", 401),
        ("/metrics", "Bearer s3cre", 401),
        ("/v1/stats", "Bearer s3cret", 200),
    ] {
        let reply = h
            .admin("GET", path, &[("authorization", authorization)], "")
            .await;
        assert_eq!(reply.status, status, "{path} with {authorization}");
    }
    h.shutdown().await;

    let open = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = AdminListener::new(open, None).err().unwrap().to_string();
    assert!(
        err.contains("not a loopback address") && err.contains("--admin-token"),
        "{err}"
    );
    let open = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = AdminListener::new(open, Some("t".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("1 bytes") && err.contains("at least 16"),
        "{err}"
    );
    let open = TcpListener::bind("0.0.0.0:0").await.unwrap();
    assert!(AdminListener::new(open, Some("0123456789abcdef".into())).is_ok());
}

#[tokio::test]
#[allow(clippy::too_many_lines)] // one key's life through the admin API
async fn admin_keys_list_get_release_expire_delete() {
    let mut h = start(Config::default()).await;
    let done = h.post("/echo", "k-done", "hello").await;
    let slow = h.slow_held("k-busy").await;
    h.post("/echo", "k-done", "hello").await; // one replay

    let list = h.admin_get("/v1/keys").await.json();
    assert_eq!(
        crate::support::each_str(&list["keys"], "key"),
        ["anon/k-busy", "anon/k-done"]
    );
    let busy = &list["keys"][0];
    assert_eq!(
        (
            busy["state"].as_str(),
            busy["fence"].as_u64(),
            busy["status"].is_null()
        ),
        (Some("processing"), Some(1), true)
    );
    assert!(busy["lease_remaining_ms"].as_u64().unwrap() > 0);
    assert_eq!(list["keys"][1]["replays"], 1);
    assert_eq!(list["keys"][1]["status"], 201);

    let processing = h
        .admin_get("/v1/keys?state=processing&limit=1")
        .await
        .json();
    assert_eq!(processing["keys"].as_array().unwrap().len(), 1);
    let first_page = h.admin_get("/v1/keys?limit=1").await.json();
    assert_eq!(first_page["next"], "anon/k-busy");
    let second_page = h
        .admin_get("/v1/keys?limit=1&after=anon%2Fk-busy")
        .await
        .json();
    assert_eq!(second_page["keys"][0]["key"], "anon/k-done");
    let by_replays = h.admin_get("/v1/keys?sort=replays&order=desc").await.json();
    assert_eq!(
        (
            by_replays["keys"][0]["key"].as_str(),
            by_replays["total"].as_u64()
        ),
        (Some("anon/k-done"), Some(2))
    );
    assert_eq!(h.admin_get("/v1/keys?limit=5000").await.status, 400);
    assert_eq!(h.admin_get("/v1/keys?state=lost").await.status, 400);

    let one = h.admin_get("/v1/keys/anon%2Fk-done").await.json();
    let response = &one["response"];
    assert_eq!(response["status"], 201);
    let stored = base64::engine::general_purpose::STANDARD
        .decode(response["body_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(stored, done.body, "the admin API shows the bytes replayed");
    assert_eq!(response["body_bytes"], done.body.len());
    assert!(
        response["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "set-cookie" && h[1] == "a=1")
    );

    assert_eq!(
        h.admin("POST", "/v1/keys/anon%2Fk-done/release", &[], "")
            .await
            .status,
        409
    );
    let released = h
        .admin("POST", "/v1/keys/anon%2Fk-busy/release", &[], "")
        .await;
    assert_eq!(released.status, 200);
    assert_eq!(released.json()["lease_remaining_ms"], 0);
    // The lease is over: a retry takes the key over (a second execution, as the operator asked).
    let takeover = h.slow_held("k-busy").await;
    h.upstream.go.add_permits(2);
    assert_eq!(takeover.await.unwrap().status, 200);
    // The released holder's completion is refused: its client is told the
    // request ran but was not recorded, never handed a second 2xx body.
    assert_problem(&slow.await.unwrap(), 503, "response-not-recorded");

    // Expired, a key is gone; deleted, too; a key never seen is not found.
    for (method, path, status) in [
        ("POST", "/v1/keys/anon%2Fk-done/expire", 200),
        ("GET", "/v1/keys/anon%2Fk-done", 404),
        ("DELETE", "/v1/keys/anon%2Fk-busy", 204),
        ("DELETE", "/v1/keys/anon%2Fk-busy", 404),
        ("POST", "/v1/keys/nope/expire", 404),
    ] {
        let reply = h.admin(method, path, &[], "").await;
        assert_eq!(reply.status, status, "{method} {path}: {reply:?}");
        if status == 404 {
            assert_problem(&reply, 404, "about:blank");
        }
    }
    h.shutdown().await;
}

#[tokio::test]
async fn decisions_stream_as_server_sent_events_and_metrics() {
    let h = start(Config::default()).await;
    let req = Request::get(format!("http://{}/v1/events", h.admin))
        .body(Body::empty())
        .unwrap();
    let response = h.client.request(req).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    // The subscription exists once the response head is back.
    h.post("/echo", "ev", "x").await;
    h.post("/echo", "ev", "x").await;
    h.put_faults(r#"{"faults":{"delete":{"kind":"delay","latency_ms":3}}}"#)
        .await;
    let mut text = String::new();
    while !text.contains("event: fault") {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let decisions: Vec<Value> = text
        .split("\n\n")
        .filter(|e| e.starts_with("event: decision"))
        .map(|e| serde_json::from_str(e.split_once("data: ").unwrap().1).unwrap())
        .collect();
    assert_eq!(decisions.len(), 2, "{text}");
    assert_eq!(
        (
            decisions[0]["outcome"].as_str(),
            decisions[0]["status"].as_u64()
        ),
        (Some("executed"), Some(201))
    );
    assert_eq!(
        (
            decisions[1]["outcome"].as_str(),
            decisions[1]["key"].as_str()
        ),
        (Some("replayed"), Some("anon/ev"))
    );
    let fault: Value = serde_json::from_str(
        text.split("event: fault\ndata: ")
            .nth(1)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            fault["op"].as_str(),
            fault["kind"].as_str(),
            fault["latency_ms"].as_u64()
        ),
        (Some("delete"), Some("delay"), Some(3))
    );

    let metrics = h.admin_get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("idem_outcomes_total{outcome=\"executed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_outcomes_total{outcome=\"replayed\"} 1"),
        "{text}"
    );
    let stats = h.admin_get("/v1/stats").await.json();
    assert!(stats["store_latency_us"]["max"].as_u64().is_some());
    assert!(stats["pool"]["instantiated"].as_u64().unwrap() >= 1);
    assert!(stats["rates_per_s"]["executed"].as_f64().unwrap() > 0.0);
    h.shutdown().await;
}

/// A claim whose request runs in this gateway is `held_here`, with its
/// holder id; its lease renewals, while the upstream works, are in the
/// key's history; once it is done, nothing holds it.
#[tokio::test]
async fn a_claim_running_here_is_held_here_and_its_renewals_are_in_its_history() {
    // The lease does not cover the upstream's time plus a store call: the
    // claim is renewed every third of it (3 s) while `/slow` waits.
    let config = Config {
        lease: Duration::from_secs(9),
        upstream_timeout: Duration::from_secs(8),
        store_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let mut h = start(config).await;
    let stats = h.admin_get("/v1/stats").await.json();
    assert_eq!(stats["gateway"]["listen"], h.proxy.to_string());
    assert_eq!(
        stats["gateway"]["name"],
        h.proxy.to_string(),
        "unnamed: its address"
    );
    assert_eq!(stats["gateway"]["version"], env!("CARGO_PKG_VERSION"));

    let slow = h.slow_held("k-held").await;
    let held = h.admin_get("/v1/keys/anon%2Fk-held").await.json();
    assert_eq!(held["state"], "processing");
    assert_eq!(held["held_here"], true, "{held}");
    let holder = held["holder"].as_str().unwrap();
    assert!(
        holder.len() == 16 && holder.chars().all(|c| c.is_ascii_hexdigit()),
        "{holder}"
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(7);
    let history = loop {
        let history = h.admin_get("/v1/keys/anon%2Fk-held/history").await.json();
        let renewed = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "renewal" && e["key"] == "anon/k-held");
        if renewed {
            break history;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no renewal: {history}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    h.upstream.go.add_permits(1);
    assert_eq!(slow.await.unwrap().status, 200);
    let done = h.admin_get("/v1/keys/anon%2Fk-held").await.json();
    assert_eq!(
        (done["state"].as_str(), done["held_here"].as_bool()),
        (Some("done"), Some(false))
    );
    assert_eq!(
        done["holder"], holder,
        "the record keeps the holder that wrote it"
    );
    let events: Vec<String> = h.admin_get("/v1/keys/anon%2Fk-held/history").await.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        events.last().map(String::as_str),
        Some("decision"),
        "{history}"
    );
    assert!(events.iter().filter(|e| *e == "renewal").count() >= 1);
    h.shutdown().await;
}
