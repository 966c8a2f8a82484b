//! SQLite durability across a `kill -9`: a process (`idem-testkit
//! complete`) records a response and is killed before any clean close; the
//! next process to open the file replays it byte for byte.

use crate::support::{TESTKIT, unique};
use idem::store::{SqliteOptions, SqliteStore};
use idem::{Decision, Guard, Response};
use idem_harness::Proc;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_response_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let body: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let body_file = dir.path().join("body.bin");
    std::fs::write(&body_file, &body).unwrap();
    let key = unique("crash");

    let mut child = Proc(
        Command::new(TESTKIT)
            .args([
                "complete",
                "--store",
                &format!("sqlite:{}", db.display()),
                "--key",
                &key,
                "--fingerprint",
                "fp",
            ])
            .arg("--body-file")
            .arg(&body_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start idem-testkit complete"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim_end(),
        format!("completed {key}"),
        "the child reports completion"
    );
    child.kill_9(); // no destructor, no checkpoint, no clean close
    let wal = std::fs::metadata(dir.path().join("idem.db-wal")).map_or(0, |m| m.len());
    assert!(
        wal > 0,
        "the commit lives in the write-ahead log the crash left behind"
    );

    let store = SqliteStore::open(&db, SqliteOptions::default()).expect("open the sqlite store");
    let guard = Guard::builder(store).build().unwrap();
    let expected = Response {
        status: 201,
        headers: vec![("x-idem-test".into(), b"crash".to_vec())],
        body,
    };
    assert_eq!(
        guard.begin(&key, "fp").await.unwrap(),
        Decision::Replay(expected),
        "replayed byte for byte"
    );
}
