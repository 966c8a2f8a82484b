//! Exactly once over HTTP: one run per key, byte-for-byte replays, 409 while in flight, 422 for another payload, 400 for a missing key, and no response ever crossing between clients.

use super::*;

#[tokio::test]
async fn first_request_runs_once_and_repeats_replay_it_byte_for_byte() {
    let h = start(Config::default()).await;
    let first = h.post("/echo", "k-1", r#"{"amount":5}"#).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotent-replayed"), None);
    let cookies: Vec<_> = first.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);

    for _ in 0..3 {
        let again = h.post("/echo", "k-1", r#"{"amount":5}"#).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.stable_headers(), first.stable_headers());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(h.calls(), 1, "the upstream ran once");
    // The upstream learns the claim's fence.
    assert_eq!(first.json()["call"], 1);
    h.shutdown().await;
}

#[tokio::test]
async fn the_upstream_sees_the_key_and_the_fence() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let app = Router::new().route(
        "/x",
        post(move |headers: HeaderMap| async move {
            let get = |n: &str| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
            recorded.lock().unwrap().push((
                get("idempotency-key"),
                get("idempotency-fence"),
                get("host"),
            ));
            "ok"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (_, proxy) = serve_memory(addr).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let reply = post_empty(&client, proxy, "/x", "\"abc\"").await;
    assert_eq!(reply.status, 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [(
            Some("\"abc\"".to_owned()),
            Some("1".to_owned()),
            Some(addr.to_string())
        )]
    );
}

#[tokio::test]
async fn a_repeat_in_flight_gets_409_with_retry_after_then_the_replay() {
    let mut h = start(Config {
        lease: Duration::from_secs(30),
        upstream_timeout: Duration::from_secs(5),
        store_timeout: Duration::from_secs(2),
        ..Config::default()
    })
    .await;
    let first = h.slow_held("k").await;
    let busy = h.post_slow("k").await;
    assert_problem(&busy, 409, "idempotency-key-in-flight");
    let retry_after: u64 = busy.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (1..=7).contains(&retry_after),
        "Retry-After {retry_after}: the holder finishes within its 5 s upstream timeout and a 2 s \
         completion, not the whole 30 s lease"
    );

    h.upstream.go.add_permits(1);
    let Reply { status, body, .. } = first.await.unwrap();
    assert_eq!((status, &body[..]), (200, &b"slow call 1"[..]));
    let replay = h.post_slow("k").await;
    assert_eq!(
        (replay.status, &replay.body[..]),
        (200, &b"slow call 1"[..])
    );
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_execute_once() {
    let h = start(Config::default()).await;
    let body = order("o-50", 1);
    let replies =
        futures::future::join_all((0..50).map(|_| h.post("/orders", "o-50", &body))).await;
    let books = h.books();
    assert_eq!(books.executions.get("o-50"), Some(&1), "{books:?}");
    assert_eq!(books.stock, 999);
    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|r| r.body == created[0].body),
        "every 201 carries the one stored body"
    );
    assert!(
        replies.iter().all(|r| r.status == 201 || r.status == 409),
        "only 201 or 409"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn with_waiting_enabled_concurrent_repeats_all_get_the_first_response() {
    let h = start(Config {
        in_flight: InFlight::Wait(Duration::from_secs(10)),
        ..Config::default()
    })
    .await;
    let body = order("o-wait", 2);
    let replies =
        futures::future::join_all((0..50).map(|_| h.post("/orders", "o-wait", &body))).await;
    assert_eq!(h.books().executions.get("o-wait"), Some(&1));
    assert!(
        replies
            .iter()
            .all(|r| r.status == 201 && r.body == replies[0].body),
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.header("idempotent-replayed").is_none())
            .count(),
        1
    );
    // Replays register to wait too; none may outlive its request.
    for i in 0..20 {
        assert_eq!(h.post("/orders", "o-wait", &body).await.status, 201, "{i}");
    }
    assert_eq!(
        h.gateway.gate().waiting_keys(),
        0,
        "no waiter outlives its request"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_key_reused_for_another_payload_is_422_and_runs_nothing() {
    let h = start(Config::default()).await;
    assert_eq!(h.post("/orders", "o-1", &order("o-1", 1)).await.status, 201);
    let other = h.post("/orders", "o-1", &order("o-1", 5)).await;
    assert_problem(&other, 422, "idempotency-key-mismatch");
    // Another path with the same key is another request too.
    assert_problem(
        &h.post("/echo", "o-1", &order("o-1", 1)).await,
        422,
        "idempotency-key-mismatch",
    );
    assert_eq!(h.books().executions.get("o-1"), Some(&1));
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn missing_and_malformed_keys_get_400_problems() {
    let h = start(Config {
        require_key: true,
        ..Config::default()
    })
    .await;
    assert_problem(
        &h.send("POST", "/echo", &[], "{}").await,
        400,
        "idempotency-key-missing",
    );
    for bad in [
        "\"unterminated",
        "\"\"",
        "has space",
        "\"bad\\escape\"",
        &"k".repeat(201),
    ] {
        let reply = h.post("/echo", bad, "{}").await;
        assert_problem(&reply, 400, "idempotency-key-malformed");
    }
    let twice = h
        .send(
            "POST",
            "/echo",
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
            "{}",
        )
        .await;
    assert_problem(&twice, 400, "idempotency-key-malformed");
    assert!(twice.detail().contains("more than one"), "{twice:?}");
    let long = h.post("/echo", &"k".repeat(201), "{}").await;
    assert!(long.detail().contains("limit is 200"), "{long:?}");
    // Unguarded methods pass through without a key.
    let get = h.send("GET", "/ledger", &[], "").await;
    assert_eq!(get.status, 200);
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn without_require_key_a_keyless_post_passes_through_unguarded() {
    let h = start(Config::default()).await;
    assert_eq!(h.send("POST", "/echo", &[], "x").await.status, 201);
    assert_eq!(h.send("POST", "/echo", &[], "x").await.status, 201);
    assert_eq!(h.calls(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn two_clients_with_the_same_key_never_see_each_others_response() {
    let h = start(Config::default()).await;
    let send = |who: &'static str, body: &'static str| {
        let h = &h;
        async move {
            h.send(
                "POST",
                "/echo",
                &[("idempotency-key", "shared"), ("authorization", who)],
                body,
            )
            .await
        }
    };
    let alice = send("Bearer alice", "alice's order").await;
    let bob = send("Bearer bob", "bob's order").await;
    assert_eq!(
        (alice.status, bob.status),
        (201, 201),
        "bob's different payload is no conflict: his key is his own"
    );
    assert_eq!(alice.json()["client"], "Bearer alice");
    assert_eq!(bob.json()["client"], "Bearer bob");
    let alice_again = send("Bearer alice", "alice's order").await;
    let bob_again = send("Bearer bob", "bob's order").await;
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(h.calls(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_request_does_not_strand_its_key() {
    let mut h = start(Config {
        in_flight: InFlight::Wait(Duration::from_secs(10)),
        ..Config::default()
    })
    .await;
    let gone = h.slow_held("d").await;
    gone.abort();
    let _ = gone.await;
    h.upstream.go.add_permits(1);
    // The first request still completes and is stored: the retry gets its response.
    let retry = h.post_slow("d").await;
    assert_replayed(&retry, 200, b"slow call 1");
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

/// A stored response says until when its key replays: `idempotency-expires`,
/// an HTTP-date, on the first response once stored and on every replay,
/// the stored record's expiry rounded down to the second (as the admin API
/// shows it). Refusals store nothing and say nothing of it.
#[tokio::test]
async fn stored_responses_tell_when_their_key_expires() {
    let mut h = start(Config::default()).await;
    let first = h.post("/echo", "k-exp", r#"{"amount":5}"#).await;
    assert_eq!(first.status, 201);
    let told = first
        .header("idempotency-expires")
        .expect("the first response says when its key expires")
        .to_owned();
    let again = h.post("/echo", "k-exp", r#"{"amount":5}"#).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("idempotency-expires"), Some(told.as_str()));

    let record = h.admin_get("/v1/keys/anon%2Fk-exp").await.json();
    let expires_at_ms = record["expires_at_ms"].as_u64().unwrap();
    let told_secs = httpdate::parse_http_date(&told)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        told_secs,
        expires_at_ms / 1000,
        "{told} vs {expires_at_ms} ms"
    );
    let retention = Config::default().retention.as_secs();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        told_secs.abs_diff(now + retention) < 600,
        "about a retention from now"
    );

    let conflict = h.post("/echo", "k-exp", r#"{"amount":6}"#).await;
    assert_eq!(conflict.status, 422);
    assert_eq!(conflict.header("idempotency-expires"), None);
    let _slow = h.slow_held("k-exp-busy").await;
    let busy = h.post_slow("k-exp-busy").await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.header("idempotency-expires"), None);
    h.upstream.go.add_permits(1);
    h.shutdown().await;
}
