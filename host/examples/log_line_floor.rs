//! The floor under `idem serve`'s request log line: the same bytes written
//! the cheapest way we know — no `tracing`, no `fmt`, the fields known in
//! advance, a hand-written formatter into one reused buffer (the date
//! formatted once a second, numbers digit by digit), one `write(2)` per line
//! to stderr, whose lock is taken once. Counted with callgrind, which counts
//! the instructions run in user space (not the kernel's side of `write(2)`
//! or `clock_gettime`): LINES lines, less a run of none, ÷ LINES.
//!
//! ```sh
//! cargo build --release -p idem --example log_line_floor
//! for n in 0 100000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/floor.$n \
//!   target/release/examples/log_line_floor text $n 2>/dev/null; done    # or json
//! ```
//!
//! `text-layer` and `json-layer` write the same line the way the gateway
//! does: a `tracing::info!` event with the gateway's fields through an
//! `info` filter and idem's own layer (`idem::cli::log_lines`), to stderr
//! — so the floor and the layer are counted by one program, and the
//! layer's profile (`callgrind_annotate --inclusive=yes`) says where the
//! difference goes. The gateway's own cost is `scripts/gateway-instructions.sh`
//! at `info` less the same at `RUST_LOG=warn` (BENCHMARKS.md, "Instructions
//! per gateway request").

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next();
    let lines: u64 = args
        .next()
        .and_then(|n| n.parse().ok())
        .expect("LINES is a number");
    let layer = match mode.as_deref() {
        Some("text-layer") => Some(idem::cli::LogFormat::Text),
        Some("json-layer") => Some(idem::cli::LogFormat::Json),
        _ => None,
    };
    if let Some(format) = layer {
        through_the_layer(format, lines);
        return;
    }
    // The line's constant pieces, around the timestamp, the key, the fence,
    // the status and the latency.
    let pieces: [&[u8]; 6] = match mode.as_deref() {
        Some("text") => [
            b"",
            b"  INFO idem::request: decided key=\"",
            b"\" decision=\"executed\" fence=",
            b" status=",
            b" latency_us=",
            b"\n",
        ],
        Some("json") => [
            b"{\"timestamp\":\"",
            b"\",\"level\":\"INFO\",\"message\":\"decided\",\"key\":\"",
            b"\",\"decision\":\"executed\",\"fence\":",
            b",\"status\":",
            b",\"latency_us\":",
            b",\"target\":\"idem::request\"}\n",
        ],
        _ => panic!("usage: log_line_floor text|json|text-layer|json-layer LINES"),
    };
    let mut stderr = std::io::stderr().lock();
    let mut line = Vec::with_capacity(256);
    let mut key = *b"anon/new-x-000000";
    let mut date = (u64::MAX, [0u8; 20]);
    for i in 0..lines {
        // A fresh key per line, as the gateway bench's, and a latency.
        let at = key.len() - 6;
        digits(&mut key[at..], i);
        let (fence, status, latency_us) = (1, 201, 1000 + i % 1000);
        line.clear();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if date.0 != now.as_secs() {
            date = (now.as_secs(), date_and_time(now.as_secs()));
        }
        line.extend_from_slice(pieces[0]);
        line.extend_from_slice(&date.1);
        let mut micros = [b'Z'; 7];
        digits(&mut micros[..6], u64::from(now.subsec_micros()));
        line.extend_from_slice(&micros);
        line.extend_from_slice(pieces[1]);
        plain(&key);
        line.extend_from_slice(&key);
        line.extend_from_slice(pieces[2]);
        decimal(&mut line, fence);
        line.extend_from_slice(pieces[3]);
        decimal(&mut line, status);
        line.extend_from_slice(pieces[4]);
        decimal(&mut line, latency_us);
        line.extend_from_slice(pieces[5]);
        stderr.write_all(&line).expect("write stderr");
    }
}

/// The same lines as the gateway writes them: its event (`Observer::decided`),
/// an `info` filter, idem's layer, stderr.
fn through_the_layer(format: idem::cli::LogFormat, lines: u64) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(idem::cli::log_lines(format, std::io::stderr))
        .init();
    let mut key = *b"anon/new-x-000000";
    for i in 0..lines {
        let at = key.len() - 6;
        digits(&mut key[at..], i);
        let key = std::str::from_utf8(&key).expect("ASCII key");
        let (fence, status, latency_us) = (Some(1u64), Some(201u16), 1000 + i % 1000);
        let reason: Option<String> = None;
        tracing::info!(
            target: "idem::request",
            message = "decided",
            key,
            decision = "executed",
            fence,
            status,
            latency_us,
            reason = reason.as_deref(),
        );
    }
}

/// The check any writer of the line must make of the key: printable ASCII
/// without a quote or backslash is copied as it is (here it always is).
fn plain(key: &[u8]) {
    let plain = key
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    assert!(plain, "the floor writes plain keys only");
}

/// `value` in decimal onto `line`.
fn decimal(line: &mut Vec<u8>, value: u64) {
    let mut text = [0u8; 20];
    let width = if value == 0 {
        1
    } else {
        value.ilog10() as usize + 1
    };
    digits(&mut text[..width], value);
    line.extend_from_slice(&text[..width]);
}

/// The last `out.len()` decimal digits of `value`, zero-padded, into `out`.
fn digits(out: &mut [u8], mut value: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// `YYYY-MM-DDTHH:MM:SS.` of `second` since the epoch (Howard Hinnant's
/// `civil_from_days`; run once a second).
fn date_and_time(second: u64) -> [u8; 20] {
    let (days, in_day) = (second / 86_400, second % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let mut text = *b"0000-00-00T00:00:00.";
    digits(&mut text[0..4], year);
    digits(&mut text[5..7], month);
    digits(&mut text[8..10], day);
    digits(&mut text[11..13], in_day / 3600);
    digits(&mut text[14..16], in_day / 60 % 60);
    digits(&mut text[17..19], in_day % 60);
    text
}
