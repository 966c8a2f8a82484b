//! Two `idem-testkit hammer` processes guard the same 1,000 keys against one shared store,
//! each requesting every key five times: across both, every key's handler
//! runs exactly once — or, for a key whose run was reported not recorded
//! (its completion did not answer within the store timeout, which a loaded
//! machine can make moto's DynamoDB miss), once more per such report, as the
//! guard documents for a lost completion.

use crate::support::{TESTKIT, dynamodb_test_url, server_url};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const KEYS: usize = 1000;

struct Run {
    executed: Vec<String>,
    not_recorded: Vec<String>,
    summary: String,
}

fn hammer_twice(store_url: &str) {
    let prefix = format!("mp-{}-{}/", std::process::id(), fastrand::u64(..));
    let spawn = || {
        Command::new(TESTKIT)
            .args([
                "hammer",
                "--store",
                store_url,
                "--keys",
                &KEYS.to_string(),
                "--prefix",
                &prefix,
                "--repeat",
                "5",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn idem-testkit hammer")
    };
    let mut children = [spawn(), spawn()];
    // Both ready (store opened, guard built), then both start at once.
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    for reader in &mut readers {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a hammer did not start");
    }
    for child in &mut children {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let runs: Vec<Run> = children
        .into_iter()
        .zip(readers)
        .map(|(child, reader)| {
            let lines: Vec<String> = reader.lines().map(Result::unwrap).collect();
            let status = child.wait_with_output().unwrap().status;
            assert!(
                status.success(),
                "a hammer failed ({status}); its last lines: {:?}",
                &lines[lines.len().saturating_sub(3)..]
            );
            Run {
                executed: lines
                    .iter()
                    .filter_map(|l| l.strip_prefix("executed ").map(str::to_owned))
                    .collect(),
                not_recorded: lines
                    .iter()
                    .filter_map(|l| l.strip_prefix("not_recorded ").map(str::to_owned))
                    .collect(),
                summary: lines.last().cloned().unwrap_or_default(),
            }
        })
        .collect();

    let mut times: HashMap<&str, usize> = HashMap::new();
    let mut lost: HashMap<&str, usize> = HashMap::new();
    for run in &runs {
        for key in &run.executed {
            *times.entry(key.as_str()).or_default() += 1;
        }
        for key in &run.not_recorded {
            *lost.entry(key.as_str()).or_default() += 1;
        }
    }
    let twice: Vec<_> = times
        .iter()
        .filter(|&(key, &n)| n > 1 + lost.get(key).copied().unwrap_or(0))
        .collect();
    assert!(
        twice.is_empty(),
        "keys executed more than once without a lost completion: {twice:?}"
    );
    let missing: Vec<_> = (0..KEYS)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| !times.contains_key(k.as_str()))
        .collect();
    assert!(missing.is_empty(), "keys never executed: {missing:?}");
    // Both processes really contended: each executed some keys and saw the other's.
    for run in &runs {
        assert!(run.summary.starts_with("summary "), "{}", run.summary);
        assert!(
            !run.executed.is_empty() && run.executed.len() < KEYS,
            "one process did everything: {}",
            run.summary
        );
    }
    println!("{}: {} | {}", store_url, runs[0].summary, runs[1].summary);
}

#[test]
fn multiprocess_redis_every_key_runs_exactly_once() {
    let Some(url) = server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    hammer_twice(&url);
}

#[test]
fn multiprocess_postgres_every_key_runs_exactly_once() {
    let Some(url) = server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    hammer_twice(&url);
}

#[test]
fn multiprocess_dynamodb_every_key_runs_exactly_once() {
    let Some(url) = dynamodb_test_url() else {
        return;
    };
    hammer_twice(&url);
}
