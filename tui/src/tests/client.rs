//! The admin client and its tasks against the fake server.

use crate::api::{FaultKind, FaultRule, KeyState, Op, Verdict};
use crate::client::{Client, ClientError, Session, SseEvent, SseParser, decode_event};
use crate::protocol::Update;
use crate::protocol::{Command, KeyQuery, Order, Sort};
use idem_fake_admin::Fake;
use std::time::Duration;

/// A client of `fake`, without a token.
fn client(fake: &Fake) -> Client {
    Client::new(&fake.url, None).unwrap()
}

/// Waits (bounded) for an update matching `want`, skipping others.
async fn next_matching(session: &mut Session, mut want: impl FnMut(&Update) -> bool) -> Update {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let update = session.updates.recv().await.expect("session ended");
            if want(&update) {
                return update;
            }
        }
    })
    .await
    .expect("no matching update within 10 s")
}

#[tokio::test]
async fn pages_filters_and_sorts_through_the_query_string() {
    let fake = Fake::with_keys(&[
        ("order", 250, KeyState::Done),
        ("pay", 3, KeyState::Processing),
    ])
    .await;
    let client = client(&fake);

    let query = KeyQuery {
        prefix: "order".into(),
        limit: 100,
        ..KeyQuery::default()
    };
    let first = client.keys(&query).await.unwrap();
    assert_eq!(first.keys.len(), 100);
    assert_eq!(first.total, Some(250));
    assert_eq!(first.keys[0].key, "order-00000");
    let second = client
        .keys(&KeyQuery {
            after: first.next.clone(),
            ..query.clone()
        })
        .await
        .unwrap();
    assert_eq!(second.keys[0].key, "order-00100");

    let processing = client
        .keys(&KeyQuery {
            state: Some(KeyState::Processing),
            ..KeyQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        processing
            .keys
            .iter()
            .map(|k| k.key.as_str())
            .collect::<Vec<_>>(),
        ["pay-00000", "pay-00001", "pay-00002"]
    );
    assert!(
        processing
            .keys
            .iter()
            .all(|k| k.lease_remaining_ms > 25_000 && k.lease_remaining_ms <= 30_000)
    );

    let by_replays = KeyQuery {
        prefix: "order".into(),
        sort: Sort::Replays,
        order: Order::Desc,
        limit: 5,
        ..KeyQuery::default()
    };
    let top = client.keys(&by_replays).await.unwrap();
    assert!(top.keys.iter().all(|k| k.replays == 6), "{:?}", top.keys);
    let sent = fake.shared.lock().keys_queries.last().cloned().unwrap();
    assert!(
        sent.contains(r#"sort=Some("replays") order=Some("desc")"#),
        "{sent}"
    );
    assert!(
        sent.contains(r#"prefix=Some("order") search=None"#),
        "an empty search is left out of the query string: {sent}"
    );
}

#[tokio::test]
async fn keys_with_reserved_characters_reach_the_server_intact() {
    let fake = Fake::with_keys(&[("tenant/a b?c#d", 1, KeyState::Processing)]).await;
    let client = client(&fake);
    let key = "tenant/a b?c#d-00000";
    let detail = client.key(key).await.unwrap().expect("found");
    assert_eq!(detail.info.key, key);
    client.release(key).await.unwrap();
    client.delete(key).await.unwrap();
    assert_eq!(
        fake.shared.requests(),
        [
            format!("POST /v1/keys/{key}/release"),
            format!("DELETE /v1/keys/{key}")
        ]
    );
    assert_eq!(
        client.key(key).await.unwrap(),
        None,
        "a deleted key is gone, not an error"
    );
}

#[tokio::test]
async fn refusals_carry_the_servers_reason() {
    let fake = Fake::with_keys(&[("done", 1, KeyState::Done)]).await;
    let client = client(&fake);
    let err = client.release("done-00000").await.unwrap_err();
    assert!(
        matches!(err, ClientError::Refused { status: 409, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("is done, not processing"), "{err}");

    let bad = FaultRule {
        kind: FaultKind::Error,
        probability: 1.5,
        ..FaultRule::default()
    };
    let err = client.set_fault(Op::Insert, &bad).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("faults.insert: probability 1.5 is outside 0 to 1"),
        "{err}"
    );
}

#[tokio::test]
async fn setting_one_fault_sends_only_that_operation() {
    let fake = Fake::start().await;
    let client = client(&fake);
    let rule = FaultRule {
        kind: FaultKind::Timeout,
        latency_ms: 250,
        probability: 0.5,
        count: Some(3),
        message: String::new(),
    };
    let answer = client.set_fault(Op::Insert, &rule).await.unwrap();
    assert_eq!(answer.faults.insert, rule);
    assert_eq!(answer.faults.get.kind, FaultKind::Off);
    let sent = fake.shared.requests();
    let body: serde_json::Value =
        serde_json::from_str(sent[0].strip_prefix("PUT /v1/faults ").unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"faults": {"insert": {"kind": "timeout", "latency_ms": 250, "probability": 0.5, "count": 3, "message": ""}}})
    );
}

#[tokio::test]
async fn a_token_is_sent_as_a_bearer_and_a_wrong_one_is_named() {
    let fake = Fake::start_on("127.0.0.1:0", Some("s3cret")).await;
    assert!(
        Client::new(&fake.url, Some("s3cret".into()))
            .unwrap()
            .faults()
            .await
            .is_ok()
    );
    let err = Client::new(&fake.url, Some("wrong".into()))
        .unwrap()
        .faults()
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Refused { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("bearer token"), "{err}");
}

#[tokio::test]
async fn a_refused_token_is_reported_as_such_not_as_a_lost_connection() {
    let fake = Fake::start_on("127.0.0.1:0", Some("s3cret")).await;
    let mut session = Session::start(client(&fake), KeyQuery::default());
    let update = next_matching(&mut session, |u| {
        matches!(u, Update::Unauthorized { .. } | Update::Disconnected(_))
    })
    .await;
    assert!(
        matches!(&update, Update::Unauthorized { status: 401, detail } if detail.contains("bearer token")),
        "{update:?}"
    );
    session.shutdown().await;
}

#[test]
fn bad_admin_urls_are_refused_with_the_reason() {
    for (url, why) in [
        (
            "127.0.0.1:9090",
            "no scheme; write it as http://127.0.0.1:9090",
        ),
        ("ftp://host/", "scheme \"ftp\" is not http"),
        ("https://host/", "https is not supported"),
        ("http://", "empty host"),
    ] {
        let err = Client::new(url, None).err().expect(url);
        assert!(matches!(err, ClientError::BadUrl { .. }));
        assert!(err.to_string().contains(why), "{url}: {err}");
    }
}

#[test]
fn sse_events_survive_any_chunking() {
    let stream = b": hello\r\nevent: decision\r\ndata: {\"a\":1}\r\n\r\nevent: fault\ndata: x\ndata: y\n\ndata: plain\n\n";
    let expected = vec![
        SseEvent {
            event: "decision".into(),
            data: "{\"a\":1}".into(),
        },
        SseEvent {
            event: "fault".into(),
            data: "x\ny".into(),
        },
        SseEvent {
            event: "message".into(),
            data: "plain".into(),
        },
    ];
    for size in 1..stream.len() {
        let mut parser = SseParser::default();
        let events: Vec<_> = stream.chunks(size).flat_map(|c| parser.push(c)).collect();
        assert_eq!(events, expected, "chunks of {size}");
    }
}

#[test]
fn unknown_or_malformed_events_are_skipped() {
    assert_eq!(
        decode_event(&SseEvent {
            event: "decision".into(),
            data: "{".into()
        }),
        None
    );
    assert_eq!(
        decode_event(&SseEvent {
            event: "other".into(),
            data: "{}".into()
        }),
        None
    );
    let ok = r#"{"ts_ms":1,"key":"k","outcome":"in_flight","status":null,"latency_us":5,"detail":"held"}"#;
    assert!(matches!(
        decode_event(&SseEvent { event: "decision".into(), data: ok.into() }),
        Some(Update::Decision(d)) if d.outcome == Verdict::InFlight && d.detail.as_deref() == Some("held")
    ));
}

#[tokio::test]
async fn the_session_streams_decisions_and_fault_changes() {
    let fake = Fake::start().await;
    let client = client(&fake);
    let mut session = Session::start(client, KeyQuery::default());
    next_matching(&mut session, |u| matches!(u, Update::Connected)).await;
    // The stream may connect a little after the first poll: emit until seen.
    let shared = fake.shared.clone();
    let emitter = tokio::spawn(async move {
        loop {
            shared.decision("order-7", Verdict::Replayed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let update = next_matching(&mut session, |u| matches!(u, Update::Decision(_))).await;
    emitter.abort();
    assert!(
        matches!(update, Update::Decision(d) if d.key == "order-7" && d.outcome == Verdict::Replayed)
    );

    let rule = FaultRule {
        kind: FaultKind::Error,
        message: "boom".into(),
        ..FaultRule::default()
    };
    session
        .commands
        .send(Command::SetFault(Op::Insert, rule.clone()))
        .unwrap();
    let update = next_matching(&mut session, |u| matches!(u, Update::Fault(_))).await;
    assert!(matches!(update, Update::Fault(f) if f.op == Op::Insert && f.rule == rule));
    session.shutdown().await;
}

#[tokio::test]
async fn a_lost_server_is_reported_and_found_again_on_the_same_address() {
    let fake = Fake::with_keys(&[("k", 2, KeyState::Processing)]).await;
    let addr = fake.addr;
    let client = client(&fake);
    let mut session = Session::start(client, KeyQuery::default());
    next_matching(
        &mut session,
        |u| matches!(u, Update::Keys { page, .. } if page.keys.len() == 2),
    )
    .await;

    fake.stop().await;
    let lost = next_matching(&mut session, |u| matches!(u, Update::Disconnected(_))).await;
    assert!(
        matches!(&lost, Update::Disconnected(e) if e.contains("refused")),
        "{lost:?}"
    );

    let again = Fake::start_on(&addr.to_string(), None).await;
    again.seed("back", 1, KeyState::Done);
    next_matching(&mut session, |u| matches!(u, Update::Connected)).await;
    let update = next_matching(&mut session, |u| matches!(u, Update::Keys { .. })).await;
    assert!(matches!(update, Update::Keys { page, .. } if page.keys[0].key == "back-00000"));
    session.shutdown().await;
}
