//! What the gateway does with what the upstream answers, or does not: 5xx, timeouts, an unreachable upstream, size limits, shedding, and a response the store could not record.

use super::*;

#[tokio::test]
async fn server_errors_release_the_key_unless_the_policy_stores_them() {
    let h = start(Config::default()).await;
    assert_eq!(h.post("/fail", "f", "").await.body, "failure 1");
    let retry = h.post("/fail", "f", "").await;
    assert_eq!(
        (retry.status, &retry.body[..]),
        (500, &b"failure 2"[..]),
        "released: the retry ran again"
    );
    h.shutdown().await;

    let h = start(Config {
        store_policy: StorePolicy {
            server_errors: true,
            timeouts: false,
        },
        ..Config::default()
    })
    .await;
    assert_eq!(h.post("/fail", "f", "").await.body, "failure 1");
    let again = h.post("/fail", "f", "").await;
    assert_replayed(&again, 500, b"failure 1");
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn an_upstream_timeout_is_504_and_releases_the_key_unless_stored() {
    let h = start(Config {
        upstream_timeout: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    assert_eq!(h.calls(), 2, "released: the retry was forwarded again");
    h.shutdown().await;

    let policy = StorePolicy {
        server_errors: false,
        timeouts: true,
    };
    let h = start(Config {
        upstream_timeout: Duration::from_millis(100),
        store_policy: policy,
        ..Config::default()
    })
    .await;
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    let replay = h.post("/hang", "t", "").await;
    assert_problem(&replay, 504, "upstream-timeout");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_releases_the_key() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let (gateway, addr) = serve_memory(closed).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..2 {
        assert_eq!(post_empty(&client, addr, "/x", "u").await.status, 502);
    }
    assert_eq!(
        gateway.observer().count(idem::server::Verdict::Executed),
        2,
        "each try was forwarded; the key was released"
    );
}

#[tokio::test]
async fn limits_on_bodies_and_responses() {
    let h = start(Config {
        max_request_bytes: 1024,
        max_response_bytes: 16 * 1024,
        lease: Duration::from_secs(1),
        upstream_timeout: Duration::from_millis(500),
        store_timeout: Duration::from_millis(500),
        ..Config::default()
    })
    .await;
    let big = "x".repeat(2048);
    let reply = h.post("/echo", "b", &big).await;
    assert_problem(&reply, 413, "body-too-large");
    assert!(reply.detail().contains("1024 bytes"), "{reply:?}");
    assert_eq!(h.calls(), 0);

    let too_large = h.post("/big", "r", "").await;
    assert_problem(&too_large, 502, "response-too-large");
    assert!(too_large.detail().contains("16384 bytes"), "{too_large:?}");
    // The upstream ran: the key is done with this answer in its place, so a
    // repeat, even long after the lease, replays it and never runs it again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let repeat = h.post("/big", "r", "").await;
    assert_problem(&repeat, 502, "response-too-large");
    assert_replayed(&repeat, 502, &too_large.body);
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn too_many_concurrent_requests_are_shed_with_503() {
    let mut h = start(Config {
        max_concurrent: 1,
        ..Config::default()
    })
    .await;
    let first = h.slow_held("c").await;
    let shed = h.post("/echo", "other", "").await;
    assert_problem(&shed, 503, "overloaded");
    h.upstream.go.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    h.shutdown().await;
}

/// A completion the store refuses: the upstream ran, but its response is not
/// handed out (a replay could contradict it). The client is told so, with
/// Retry-After; once the lease runs out the retry runs the order again under
/// a higher fence, and from then on every answer for the key is that one.
#[tokio::test]
async fn a_response_the_store_could_not_record_is_not_given_out() {
    let h = start(Config {
        lease: Duration::from_secs(1),
        upstream_timeout: Duration::from_millis(500),
        store_timeout: Duration::from_millis(500),
        ..Config::default()
    })
    .await;
    let fault = h
        .put_faults(r#"{"faults":{"replace":{"kind":"error","message":"disk full","count":1}}}"#)
        .await;
    assert_eq!(fault.status, 200, "{fault:?}");
    let body = order("o-nr", 1);
    let first = h.post("/orders", "o-nr", &body).await;
    assert_problem(&first, 503, "response-not-recorded");
    assert_eq!(first.header("retry-after"), Some("1"));
    assert!(first.detail().contains("disk full"), "{first:?}");
    assert_eq!(h.books().executions.get("o-nr"), Some(&1));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = h.post("/orders", "o-nr", &body).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    let replay = h.post("/orders", "o-nr", &body).await;
    assert_eq!((replay.status, &replay.body), (201, &retry.body));
    let books = h.books();
    assert_eq!(books.executions.get("o-nr"), Some(&2), "{books:?}");
    let fences = &books.fences["o-nr"];
    assert!(
        fences[1] > fences[0],
        "the rerun has the higher fence: {fences:?}"
    );
    h.shutdown().await;
}
