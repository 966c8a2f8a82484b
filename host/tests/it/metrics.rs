//! `/metrics` of a real `idem serve`, as Prometheus reads it: every metric
//! has its HELP and TYPE, and durations are in seconds.

use crate::console::{order, post, serve};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn every_metric_has_help_and_type_and_durations_are_seconds() {
    let (_ledger, _serve, proxy_port, admin_port) = serve(&[]);
    assert_eq!(post(proxy_port, "m-1", &order("m-1")) / 100, 2);
    let response = get(admin_port, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut families = Vec::new();
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let name = line.split(['{', ' ']).next().unwrap();
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "not a number: {line}");
        assert!(
            body.contains(&format!("# HELP {name} ")) && body.contains(&format!("# TYPE {name} ")),
            "{name} has no HELP or TYPE:\n{body}"
        );
        assert!(
            !name.ends_with("_us") && !name.ends_with("_ms"),
            "{name}: durations are in seconds\n{body}"
        );
        families.push(name.to_owned());
    }
    for name in [
        "idem_outcomes_total",
        "idem_store_latency_seconds",
        "idem_faults_injected_total",
        "idem_pool_idle",
        "idem_uptime_seconds",
        "idem_purge_runs_total",
        "idem_purged_records_total",
        "idem_purge_errors_total",
        "idem_purge_last_duration_seconds",
    ] {
        assert!(
            families.iter().any(|f| f == name),
            "{name} missing:\n{body}"
        );
    }
    assert!(
        body.contains("idem_outcomes_total{outcome=\"executed\"} 2"),
        "the warm-up and m-1 executed:\n{body}"
    );
    // The store answered in well under a second: a value in seconds, not µs.
    let p99: f64 = body
        .lines()
        .find(|l| l.starts_with("idem_store_latency_seconds{quantile=\"0.99\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap();
    assert!(p99 > 0.0 && p99 < 1.0, "{p99}");
}
