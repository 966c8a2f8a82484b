//! HTTP beyond the happy path: the Stripe profile, `OPTIONS *`, malformed requests, graceful shutdown, and the same semantics through the tower layer in an axum app.

use super::*;

#[tokio::test]
async fn the_stripe_profile_speaks_stripe() {
    let mut h = start(Config {
        profile: Profile::Stripe,
        ..Config::default()
    })
    .await;
    assert_eq!(h.post("/echo", "s", "one").await.status, 201);
    let mismatch = h.post("/echo", "s", "two").await;
    assert_eq!(mismatch.status, 400);
    assert_eq!(mismatch.json()["error"]["type"], "idempotency_error");
    let replay = h.post("/echo", "s", "one").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    let first = h.slow_held("busy").await;
    let busy = h.post_slow("busy").await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.json()["error"]["code"], "idempotency_key_in_use");
    h.upstream.go.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    h.shutdown().await;
}

/// Writes the raw bytes `request` on a fresh connection to `addr` and reads
/// the answer until the server closes it, as text.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// `OPTIONS *` asks about the server, not a resource: the gateway answers it
/// itself (400, naming why) and never appends `*` to the upstream's address,
/// which used to send it to port 80 of another host.
#[tokio::test]
async fn options_asterisk_is_not_forwarded() {
    let h = start(Config::default()).await;
    let answer = exchange(
        h.proxy,
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not a path"), "{answer}");
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_http_gets_an_error_and_the_gateway_keeps_serving() {
    let h = start(Config {
        max_headers: 20,
        ..Config::default()
    })
    .await;
    for garbage in [
        &b"\x00\x01\x02 nonsense\r\n\r\n"[..],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nBad Header\r\n\r\n",
    ] {
        let answer = exchange(h.proxy, garbage).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    }
    let many: Vec<(String, String)> = (0..30)
        .map(|i| (format!("x-h{i}"), "v".to_owned()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut head = String::from("POST /echo HTTP/1.1\r\nHost: x\r\n");
    for (n, v) in &many {
        let _ = write!(head, "{n}: {v}\r\n");
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    let answer = exchange(h.proxy, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");

    // A body the upstream cannot parse is its 400, stored and replayed like any 4xx.
    let bad = h.post("/orders", "j", "{not json").await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        h.post("/orders", "j", "{not json")
            .await
            .header("idempotent-replayed"),
        Some("true")
    );
    assert_eq!(
        h.post("/echo", "fine", "ok").await.status,
        201,
        "still serving"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let mut h = start(Config::default()).await;
    let in_flight = h.slow_held("g").await;
    let _ = h.stop.take().unwrap().send(());
    let proxy = h.proxy;
    // New connections are refused once the listener is closed; wait for that state.
    while tokio::net::TcpStream::connect(proxy).await.is_ok() {
        tokio::task::yield_now().await;
    }
    h.upstream.go.add_permits(1);
    let Reply { status, body, .. } = in_flight.await.unwrap();
    assert_eq!((status, &body[..]), (200, &b"slow call 1"[..]));
    h.served.await.unwrap();
    let _ = &h.gateway;
}

/// Serves `app` on a port of its own; a function that POSTs a body to its
/// `/orders` with an idempotency key and returns the status, headers and body.
async fn serve_app(
    app: Router,
) -> impl Fn(&'static str, &'static str) -> futures::future::BoxFuture<'static, (u16, HeaderMap, Bytes)>
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    move |key, body| {
        let client = client.clone();
        Box::pin(async move {
            let req = Request::post(format!("http://{addr}/orders"))
                .header("idempotency-key", key)
                .body(Body::from(body))
                .unwrap();
            let (parts, body) = client.request(req).await.unwrap().into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts.status.as_u16(), parts.headers, body)
        })
    }
}

#[tokio::test]
async fn the_tower_layer_gives_an_axum_app_the_same_semantics() {
    use idem::server::IdempotencyLayer;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let store = idem::store::open("memory:").await.unwrap();
    let layer = IdempotencyLayer::new(Config::default(), store).unwrap();
    let app: Router = Router::new()
        .route(
            "/orders",
            post(move |body: String| async move {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    format!("order {body} charged, run {n}"),
                )
            }),
        )
        .layer(layer.clone());
    let post_order = serve_app(app).await;
    let post = async |key, body| {
        let (status, headers, body) = post_order(key, body).await;
        (status, body, headers.contains_key("idempotent-replayed"))
    };
    let first = post("o-7", "o-7").await;
    assert_eq!(first, (201, Bytes::from("order o-7 charged, run 1"), false));
    assert_eq!(
        post("o-7", "o-7").await,
        (201, Bytes::from("order o-7 charged, run 1"), true)
    );
    assert_eq!(post("o-7", "other").await.0, 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The layer's store is the gateway's stack: its faults fail it closed.
    layer
        .faults()
        .set_all(&idem::FaultRule::error("down"))
        .unwrap();
    assert_eq!(post("o-8", "o-8").await.0, 503);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_handler_that_panics_gets_a_500_problem_and_the_server_goes_on() {
    use idem::server::IdempotencyLayer;
    let store = idem::store::open("memory:").await.unwrap();
    let app: Router = Router::new()
        .route(
            "/orders",
            post(|body: String| async move {
                assert!(body != "boom", "the handler panicked on purpose");
                (StatusCode::CREATED, format!("order {body}"))
            }),
        )
        .layer(IdempotencyLayer::new(Config::default(), store).unwrap());
    let post = serve_app(app).await;
    let (_, headers, body) = post("p-1", "boom").await;
    assert_eq!(
        headers[axum::http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 500);
    assert!(
        problem["detail"].as_str().unwrap().contains("panicked"),
        "{problem}"
    );
    // The same server, even the same pooled connection, goes on serving.
    let (_, _, body) = post("p-2", "fine").await;
    assert_eq!(&body[..], b"order fine");
}
