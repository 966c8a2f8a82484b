//! The check of the `gateway` fuzz target (`fuzz/`), and of its regression
//! test: arbitrary bytes become inputs to the gateway's parsing — the
//! `Idempotency-Key` header, the client scope, the fingerprinted headers,
//! the hop-by-hop headers, problem bodies, durations, `--in-flight` and
//! fault rules — and it panics when an invariant breaks, not only when the
//! code panics. Each parser is compared with a reference written here from
//! its documentation, or checked by a round trip.
//!
//! Engine-free (built with `default-features = false`), so the fuzz target
//! does not build wasmtime. A crash saved under `fuzz/regressions/gateway/`
//! replays through [`check_gateway`] in `cargo test -p idem`.

use crate::server::config::{InFlight, Profile, parse_duration};
use crate::server::parse::{
    HOP_BY_HOP, MAX_KEY_BYTES, fingerprinted_headers, idempotency_key, scoped_key, strip_hop_by_hop,
};
use crate::server::problem::Problem;
use crate::store::{FaultKind, FaultRule, Op};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::time::Duration;

/// Reads inputs from the fuzzer's bytes; past the end, zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.u8()))
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = usize::from(self.u8()) % (max + 1);
        let len = len.min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        taken.to_vec()
    }

    /// Text drawn mostly from `alphabet` (so the grammar's words form), or
    /// arbitrary bytes read as UTF-8.
    fn text(&mut self, alphabet: &[&str], max: usize) -> String {
        if self.u8().is_multiple_of(4) {
            return String::from_utf8_lossy(&self.bytes(max)).into_owned();
        }
        let n = usize::from(self.u8()) % (max + 1);
        (0..n)
            .map(|_| alphabet[usize::from(self.u8()) % alphabet.len()])
            .collect()
    }

    /// A header name from a small pool, in any case, or arbitrary bytes.
    fn header_name(&mut self) -> Vec<u8> {
        const POOL: &[&str] = &[
            "content-type",
            "Content-Type",
            "authorization",
            "x-a",
            "X-B",
            "connection",
            "Connection",
            "keep-alive",
            "te",
            "transfer-encoding",
            "upgrade",
            "idempotency-key",
        ];
        let pick = usize::from(self.u8());
        match POOL.get(pick % (POOL.len() + 1)) {
            Some(name) => name.as_bytes().to_vec(),
            None => self.bytes(12),
        }
    }

    /// A header map of up to 8 headers, in the order appended; pairs that
    /// are not valid header names or values are skipped.
    fn headers(&mut self) -> (HeaderMap, Vec<(HeaderName, HeaderValue)>) {
        let mut map = HeaderMap::new();
        let mut appended = Vec::new();
        for _ in 0..self.u8() % 9 {
            let name = self.header_name();
            let value = if self.u8().is_multiple_of(2) {
                self.text(&["x-a", "te", ", ", "X-B", "upgrade", ",", " "], 6)
                    .into_bytes()
            } else {
                self.bytes(16)
            };
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&name),
                HeaderValue::from_bytes(&value),
            ) {
                map.append(name.clone(), value.clone());
                appended.push((name, value));
            }
        }
        (map, appended)
    }
}

/// One input of the `gateway` fuzz target: its first byte picks the parser.
pub fn check_gateway(data: &[u8]) {
    let mut input = Input(data);
    match input.u8() % 7 {
        0 => check_key(&input.bytes(255)),
        1 => check_scope(&mut input),
        2 => check_fingerprinted_headers(&mut input),
        3 => check_hop_by_hop(&mut input),
        4 => check_problem(&mut input),
        5 => check_durations(&mut input),
        _ => check_fault_rule(&mut input),
    }
}

/// The key grammar, read from the docs: a quoted string (`"`…`"`, only `\"`
/// and `\\` escaped, printable ASCII inside) or a bare token of visible
/// ASCII; 1 to `MAX_KEY_BYTES` bytes once unquoted.
fn reference_key(raw: &[u8]) -> Option<Vec<u8>> {
    let key = if raw.first() == Some(&b'"') {
        if raw.len() < 2 || raw.last() != Some(&b'"') {
            return None;
        }
        let inner = &raw[1..raw.len() - 1];
        let mut key = Vec::new();
        let mut i = 0;
        while i < inner.len() {
            match inner[i] {
                b'\\' => match inner.get(i + 1) {
                    Some(&e) if e == b'"' || e == b'\\' => {
                        key.push(e);
                        i += 2;
                    }
                    _ => return None,
                },
                b'"' => return None,
                c if (0x20..=0x7e).contains(&c) => {
                    key.push(c);
                    i += 1;
                }
                _ => return None,
            }
        }
        key
    } else if raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
        raw.to_vec()
    } else {
        return None;
    };
    (1..=MAX_KEY_BYTES).contains(&key.len()).then_some(key)
}

/// Quotes `key` as a structured-field string.
fn quote(key: &str) -> Vec<u8> {
    let mut out = vec![b'"'];
    for b in key.bytes() {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

fn check_key(raw: &[u8]) {
    let parsed = idempotency_key(raw);
    let expected = reference_key(raw);
    match (&parsed, &expected) {
        (Ok(key), Some(want)) => assert_eq!(key.as_bytes(), want.as_slice(), "{raw:?}"),
        (Err(why), None) => assert!(!why.to_string().is_empty(), "{raw:?}: an empty error"),
        _ => panic!("{raw:?}: parsed {parsed:?}, the grammar says {expected:?}"),
    }
    if let Ok(key) = parsed {
        assert!(key.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{key:?}");
        // Any key comes back through its quoted form.
        assert_eq!(idempotency_key(&quote(&key)).as_ref(), Ok(&key));
    }
}

fn check_scope(input: &mut Input) {
    let client = |input: &mut Input| (!input.u8().is_multiple_of(4)).then(|| input.bytes(40));
    let (a, b) = (client(input), client(input));
    let (key_a, key_b) = (
        input.text(&["k", "/", "anon", "0"], 8),
        input.text(&["k", "/"], 8),
    );
    let scoped = scoped_key(a.as_deref(), &key_a);
    assert_eq!(
        scoped,
        scoped_key(a.as_deref(), &key_a),
        "not deterministic"
    );
    let (scope, rest) = scoped.split_once('/').expect("a scope and a key");
    assert_eq!(rest, key_a, "the key after the first '/' is the client's");
    match &a {
        None => assert_eq!(scope, "anon"),
        Some(_) => assert!(
            scope.len() == 16
                && scope
                    .bytes()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "scope {scope:?} is not 16 hex digits"
        ),
    }
    // Two clients, or two keys, never share a store key.
    let other = scoped_key(b.as_deref(), &key_b);
    assert_eq!(
        scoped == other,
        a == b && key_a == key_b,
        "{a:?}/{key_a:?} and {b:?}/{key_b:?} give {scoped:?} and {other:?}"
    );
}

fn check_fingerprinted_headers(input: &mut Input) {
    let (map, appended) = input.headers();
    let names: Vec<String> = (0..input.u8() % 4)
        .map(|_| String::from_utf8_lossy(&input.header_name()).into_owned())
        .collect();
    let selected = fingerprinted_headers(&map, &names);
    // Every value of each named header, names in order, values as appended.
    let expected: Vec<(String, Vec<u8>)> = names
        .iter()
        .flat_map(|name| {
            appended
                .iter()
                .filter(move |(n, _)| n.as_str().eq_ignore_ascii_case(name))
                .map(move |(_, v)| (name.clone(), v.as_bytes().to_vec()))
        })
        .collect();
    assert_eq!(selected, expected, "names {names:?}");

    // A header that is not named changes nothing.
    let mut more = map.clone();
    if !names.iter().any(|n| n.eq_ignore_ascii_case("x-unnamed")) {
        more.append("x-unnamed", HeaderValue::from_static("v"));
        assert_eq!(fingerprinted_headers(&more, &names), selected);
    }
    // The fingerprint does not depend on the order the names are configured in.
    let reversed: Vec<String> = names.iter().rev().cloned().collect();
    let fp = |headers: &[(String, Vec<u8>)]| {
        idem_guest::fingerprint::fingerprint("POST", "/orders", headers, b"{}")
    };
    assert_eq!(
        fp(&selected),
        fp(&fingerprinted_headers(&map, &reversed)),
        "names {names:?}"
    );
}

fn check_hop_by_hop(input: &mut Input) {
    let (mut map, appended) = input.headers();
    // The names `Connection` lists, read from the input, not from the map.
    let named: Vec<String> = appended
        .iter()
        .filter(|(name, _)| name == "connection")
        .filter_map(|(_, value)| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let removed = |name: &HeaderName| {
        HOP_BY_HOP.contains(&name.as_str()) || named.iter().any(|n| n == name.as_str())
    };
    strip_hop_by_hop(&mut map);
    for name in map.keys() {
        assert!(!removed(name), "{name} was forwarded");
    }
    // Everything else is kept, every value in order.
    for (name, _) in &appended {
        let kept: Vec<&HeaderValue> = map.get_all(name).iter().collect();
        let expected: Vec<&HeaderValue> = if removed(name) {
            vec![]
        } else {
            appended
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v)
                .collect()
        };
        assert_eq!(kept, expected, "{name}");
    }
}

fn check_problem(input: &mut Input) {
    let text = |input: &mut Input| String::from_utf8_lossy(&input.bytes(40)).into_owned();
    let problem = match input.u8() % 14 {
        0 => Problem::KeyMissing {
            header: text(input),
        },
        1 => Problem::KeyMalformed(text(input)),
        2 => Problem::KeyMismatch,
        3 => Problem::InFlight {
            retry_after: Duration::from_millis(input.u64() >> (input.u8() % 64)),
        },
        4 => Problem::StoreUnavailable(text(input)),
        5 => Problem::BodyTooLarge {
            limit: input.u64() as usize,
        },
        6 => Problem::BadRequest(text(input)),
        7 => Problem::UpstreamFailed(text(input)),
        8 => Problem::UpstreamTimeout(Duration::from_millis(input.u64() >> (input.u8() % 64))),
        9 => Problem::ResponseTooLarge {
            limit: input.u64() as usize,
        },
        10 => Problem::Overloaded {
            limit: input.u64() as usize,
            guarded: input.u8().is_multiple_of(2),
        },
        12 => Problem::NotRecorded {
            why: text(input),
            retry_after: Duration::from_millis(input.u64() >> (input.u8() % 64)),
        },
        11 => Problem::BodyTimeout {
            after: Duration::from_millis(input.u64() >> (input.u8() % 64)),
            min_rate: input.u64(),
        },
        _ => Problem::Internal(text(input)),
    };
    let status = problem.status();
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{problem:?}"
    );
    let detail = problem.detail();
    if let Problem::KeyMalformed(why)
    | Problem::BadRequest(why)
    | Problem::Internal(why)
    | Problem::UpstreamFailed(why)
    | Problem::StoreUnavailable(why)
    | Problem::NotRecorded { why, .. } = &problem
    {
        assert!(detail.contains(why.as_str()), "the detail hides {why:?}");
    }

    let ietf = problem.render(Profile::Ietf);
    assert_eq!(ietf.status, status);
    assert_eq!(ietf.content_type, "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&ietf.body).expect("the body is JSON");
    let fields = body.as_object().expect("an object");
    assert_eq!(fields.len(), 4, "{body}");
    assert_eq!(
        fields["type"],
        format!("https://idem.dev/problems/{}", problem.slug())
    );
    assert_eq!(fields["status"], status.as_u16());
    assert_eq!(fields["detail"], detail.as_str());
    assert!(fields["title"].as_str().is_some_and(|t| !t.is_empty()));

    let stripe = problem.render(Profile::Stripe);
    assert_eq!(stripe.content_type, "application/json");
    let expected_status = match problem {
        Problem::KeyMismatch => StatusCode::BAD_REQUEST,
        _ => status,
    };
    assert_eq!(stripe.status, expected_status);
    let body: serde_json::Value = serde_json::from_str(&stripe.body).expect("the body is JSON");
    assert_eq!(
        body.as_object().map(serde_json::Map::len),
        Some(1),
        "{body}"
    );
    let error = &body["error"];
    assert_eq!(error["message"], detail.as_str());
    assert!(
        error["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("_error"))
    );
    assert_eq!(
        error.get("code").is_some(),
        matches!(problem, Problem::InFlight { .. }),
        "{body}"
    );

    // Retry-After: where a retry can work, at least 1 s, and an in-flight
    // key's remaining lease rounded up.
    let retry = match &problem {
        Problem::InFlight { retry_after } | Problem::NotRecorded { retry_after, .. } => {
            Some(retry_after.as_millis().div_ceil(1000).max(1) as u64)
        }
        Problem::StoreUnavailable(_) | Problem::Overloaded { .. } => Some(1),
        _ => None,
    };
    assert_eq!(ietf.retry_after_secs, retry, "{problem:?}");
    assert_eq!(stripe.retry_after_secs, retry, "{problem:?}");
}

/// The duration grammar, read from the docs: a whole number, then `ms`,
/// `s`, `m`, `h` or nothing (seconds), around optional whitespace.
fn reference_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (number, unit_ms) = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)]
        .iter()
        .find_map(|(unit, ms)| t.strip_suffix(unit).map(|n| (n, *ms)))
        .unwrap_or((t, 1000));
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = number.parse::<u64>().ok()?.checked_mul(unit_ms)?;
    Some(Duration::from_millis(ms))
}

fn check_durations(input: &mut Input) {
    const WORDS: &[&str] = &[
        "0",
        "1",
        "2",
        "5",
        "9",
        "00",
        "ms",
        "s",
        "m",
        "h",
        " ",
        "wait:",
        "reject",
        "x",
        "μ",
        "18446744073709551615",
    ];
    let text = input.text(WORDS, 6);
    let parsed = parse_duration(&text);
    assert_eq!(parsed.clone().ok(), reference_duration(&text), "{text:?}");
    match parsed {
        Ok(d) => {
            let ms = d.as_millis();
            assert_eq!(parse_duration(&format!("{ms}ms")), Ok(d), "round trip");
        }
        Err(why) => assert!(
            why.to_string().contains(&format!("{text:?}")),
            "{why} does not name the input"
        ),
    }
    let in_flight = text.parse::<InFlight>();
    let expected = if text == "reject" {
        Some(InFlight::Reject)
    } else {
        text.strip_prefix("wait:")
            .and_then(reference_duration)
            .map(InFlight::Wait)
    };
    assert_eq!(in_flight.ok(), expected, "{text:?}");
}

fn check_fault_rule(input: &mut Input) {
    const WORDS: &[&str] = &[
        "error", "timeout", "delay", "lost", "off", "(", ")", "%", "*", "ms", "0", "1", "3", "5",
        "9", "50", "100", ".", "e", "-", " ", "x", "inf", "NaN", "get", "insert",
    ];
    let text = input.text(WORDS, 10);
    let _ = text.parse::<Op>().map(|op| assert_eq!(op.as_str(), text));
    let rule = match text.parse::<FaultRule>() {
        Ok(rule) => rule,
        Err(e) => {
            assert!(!e.0.is_empty());
            return;
        }
    };
    assert!(
        rule.validate().is_ok(),
        "{text:?} parsed to an invalid {rule:?}"
    );
    assert!((0.0..=1.0).contains(&rule.probability), "{rule:?}");
    assert!(rule.latency_ms <= 60_000, "{rule:?}");
    match rule.kind {
        FaultKind::Timeout | FaultKind::Delay => {}
        _ => assert_eq!(rule.latency_ms, 0, "{text:?}: {rule:?}"),
    }
    if rule.kind != FaultKind::Error {
        assert!(rule.message.is_empty(), "{text:?}: {rule:?}");
    }
    // The text form shown to operators parses back to the same rule.
    let shown = rule.to_string();
    let again: FaultRule = shown
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} shows as {shown:?}, which does not parse: {e}"));
    assert_eq!(again, rule, "{text:?} shows as {shown:?}");
    // And so does its JSON (the admin API's form).
    let json = serde_json::to_string(&rule).unwrap();
    assert_eq!(
        serde_json::from_str::<FaultRule>(&json).unwrap(),
        rule,
        "{json}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every input saved under `fuzz/regressions/gateway/` replays through the check.
    #[test]
    fn gateway_fuzz_regressions_replay() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/gateway");
        let mut replayed = 0;
        for file in std::fs::read_dir(&dir).expect("fuzz/regressions/gateway") {
            let path = file.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check_gateway(&bytes));
            assert!(outcome.is_ok(), "regression {} fails", path.display());
            replayed += 1;
        }
        assert!(replayed > 0, "no regression input under {}", dir.display());
    }

    #[test]
    fn every_parser_is_reached() {
        for first in 0..7u8 {
            check_gateway(&[first]);
            check_gateway(&[first, 0xff, 3, b'a', b'"', 7, 1, 2, 3, 4, 5, 6, 7, 8]);
        }
    }
}
