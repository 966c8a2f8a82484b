//! A store that cannot be opened says where it tried and why, so that the
//! operator can fix the URL or the server without guessing.

#[tokio::test]
async fn a_postgres_server_that_cannot_be_reached_is_named_with_the_cause() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let url = "postgres://idem@127.0.0.1:1/orders?timeout_ms=2000";
    let err = match idem::store::open(url).await {
        Ok(_) => panic!("opened a store on port 1"),
        Err(e) => e.to_string(),
    };
    for part in [
        "127.0.0.1:1",
        "database \"orders\"",
        "user \"idem\"",
        "refused",
    ] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
}

#[tokio::test]
async fn a_missing_postgres_database_is_named() {
    let Ok(base) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        eprintln!("IDEM_TEST_POSTGRES_URL is not set: skipping the missing-database check");
        return;
    };
    let (server, _) = base.rsplit_once('/').unwrap();
    let url = format!("{server}/idem_no_such_database");
    let err = match idem::store::open(&url).await {
        Ok(_) => panic!("opened a store on a missing database"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("database \"idem_no_such_database\"") && err.contains("does not exist"),
        "{err}"
    );
}
