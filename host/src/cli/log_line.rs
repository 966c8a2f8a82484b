//! The log lines `idem serve` writes when stderr is not a terminal: the
//! same bytes as `tracing-subscriber`'s own text (`Full`, no colours) and
//! flattened JSON formatters, written by a `tracing` layer of our own.
//!
//! At `info` the gateway writes a line for every guarded request.
//! `tracing-subscriber`'s formatters made that line cost 9.3k instructions,
//! 17 % of a replay (benchmarks/log.md, "Issue 47"): each field went through
//! `fmt` machinery, the date was worked out from the epoch for every line,
//! and the text format painted styles even with colours off. Here strings
//! and numbers are copied straight into one reused buffer, the date is
//! formatted once a second per thread, nothing is styled, and the line is
//! one write. On a terminal the text format stays `tracing-subscriber`'s,
//! coloured.
//!
//! The gateway makes no `tracing` spans, so a line says nothing of spans.

use std::cell::RefCell;
use std::fmt::{self, Write};
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer};

/// How a line is laid out.
#[derive(Clone, Copy, Debug)]
pub(super) enum LogLine {
    /// `2026-12-07T02:53:51.876207Z  INFO idem::request: decided key="anon/o-1" fence=1 …`
    Text,
    /// `{"timestamp":"…","level":"INFO","message":"decided","key":"anon/o-1",…,"target":"idem::request"}`
    Json,
}

/// A `tracing` layer writing each event it sees as one [`LogLine`] to the
/// writers `make` makes (stderr for `idem serve`), with one `write_all`.
pub(super) struct Lines<W> {
    pub(super) format: LogLine,
    pub(super) make: W,
}

/// Lines longer than this (a huge reason, say) are written from a buffer
/// of their own, so that a thread does not keep one this size.
const KEPT_CAPACITY: usize = 4096;

thread_local! {
    /// The line being written, reused: a line costs no allocation.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S, W> Layer<S> for Lines<W>
where
    S: Subscriber,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        LINE.with(|kept| {
            // `tracing` drops an event logged while this one is written (by
            // a value's `Debug`, say), so the buffer is free; were it not,
            // the line would get one of its own rather than panic.
            let (mut borrowed, mut own);
            let line: &mut String = if let Ok(line) = kept.try_borrow_mut() {
                borrowed = line;
                &mut borrowed
            } else {
                own = String::new();
                &mut own
            };
            line.clear();
            self.format.write(line, event);
            // As `tracing-subscriber` does, a line that cannot be written
            // is dropped: there is nowhere left to say so.
            let _ = self
                .make
                .make_writer_for(event.metadata())
                .write_all(line.as_bytes());
            if line.capacity() > KEPT_CAPACITY {
                *line = String::new();
            }
        });
    }
}

impl LogLine {
    /// `event` as one line, its newline included, onto `line`.
    fn write(self, line: &mut String, event: &Event<'_>) {
        let meta = event.metadata();
        match self {
            LogLine::Text => {
                write_timestamp(line, SystemTime::now());
                line.push_str(match *meta.level() {
                    Level::TRACE => " TRACE ",
                    Level::DEBUG => " DEBUG ",
                    Level::INFO => "  INFO ",
                    Level::WARN => "  WARN ",
                    Level::ERROR => " ERROR ",
                });
                line.push_str(meta.target());
                line.push_str(": ");
                event.record(&mut Fields {
                    line,
                    json: false,
                    first: true,
                });
            }
            LogLine::Json => {
                line.push_str("{\"timestamp\":\"");
                write_timestamp(line, SystemTime::now());
                line.push_str("\",\"level\":\"");
                line.push_str(meta.level().as_str());
                line.push('"');
                event.record(&mut Fields {
                    line,
                    json: true,
                    first: true,
                });
                line.push_str(",\"target\":");
                json_string(line, meta.target());
                line.push('}');
            }
        }
        line.push('\n');
    }
}

/// The event's fields as `tracing-subscriber` writes them. Text
/// (`DefaultFields`): the message as it is, then ` name=value` (strings
/// quoted and escaped as Rust's `{:?}` does). JSON (flattened):
/// `,"name":value`, numbers and booleans as such, anything else a string.
struct Fields<'a> {
    line: &'a mut String,
    json: bool,
    /// Text: no field written yet.
    first: bool,
}

impl Fields<'_> {
    /// Starts a field: text, a space before all but the first, then
    /// `name=` (nothing for the message); JSON, `,"name":`. The line, to
    /// write the value on.
    fn name(&mut self, field: &Field) -> &mut String {
        let name = field.name();
        if self.json {
            self.line.push_str(",\"");
            json_escaped(self.line, name);
            self.line.push_str("\":");
            return self.line;
        }
        if self.first {
            self.first = false;
        } else {
            self.line.push(' ');
        }
        if name != "message" {
            self.line.push_str(name.strip_prefix("r#").unwrap_or(name));
            self.line.push('=');
        }
        self.line
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.json {
            json_string(self.name(field), value);
        } else if field.name() == "message" {
            let _ = Sanitized(self.name(field)).write_str(value);
        } else {
            quoted(self.name(field), value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field)
            .push_str(if value { "true" } else { "false" });
    }

    /// JSON has no NaN or infinity: `null` for those, as `serde_json` writes them.
    fn record_f64(&mut self, field: &Field, value: f64) {
        let json = self.json;
        let line = self.name(field);
        if !json {
            let _ = write!(Sanitized(line), "{value:?}");
        } else if value.is_finite() {
            let _ = write!(line, "{value:?}");
        } else {
            line.push_str("null");
        }
    }

    /// The message (`format_args!`) and `%display` / `?debug` values. In
    /// text their escape sequences are escaped, as `tracing-subscriber` does
    /// the message's, so that no value can drive the terminal the log is
    /// read on; in JSON they are strings.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let json = self.json;
        let line = self.name(field);
        if json {
            line.push('"');
            let _ = write!(JsonEscaped(line), "{value:?}");
            line.push('"');
        } else {
            let _ = write!(Sanitized(line), "{value:?}");
        }
    }
}

/// `value` as `{:?}` writes it; a string of printable ASCII without a
/// quote or backslash (a key, a decision) is copied as it is.
fn quoted(line: &mut String, value: &str) {
    let plain = value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if plain {
        line.push('"');
        line.push_str(value);
        line.push('"');
    } else {
        let _ = write!(line, "{value:?}");
    }
}

/// Writes through, with the characters that start terminal escape
/// sequences escaped as `tracing-subscriber` escapes them in a message.
struct Sanitized<'a>(&'a mut String);

impl Write for Sanitized<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let harmless = |b: &u8| b.is_ascii() && !matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f);
        if s.as_bytes().iter().all(harmless) {
            self.0.push_str(s);
            return Ok(());
        }
        for c in s.chars() {
            match c {
                '\x1b' => self.0.push_str("\\x1b"),
                '\x07' => self.0.push_str("\\x07"),
                '\x08' => self.0.push_str("\\x08"),
                '\x0c' => self.0.push_str("\\x0c"),
                '\x7f' => self.0.push_str("\\x7f"),
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// `value` as a JSON string.
fn json_string(line: &mut String, value: &str) {
    line.push('"');
    json_escaped(line, value);
    line.push('"');
}

/// `value` escaped for the inside of a JSON string, as `serde_json` escapes
/// it: `"`, `\` and the control characters below U+0020.
fn json_escaped(line: &mut String, value: &str) {
    // Most values (names, keys, decisions) need none: one scan, one copy.
    let Some(first) = first_json_special(value.as_bytes()) else {
        line.push_str(value);
        return;
    };
    // The byte at `first` is ASCII: a character boundary.
    line.push_str(&value[..first]);
    let mut plain_from = first;
    for (at, byte) in value.bytes().enumerate().skip(first) {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        // `byte` is ASCII: `at` and `at + 1` are character boundaries.
        line.push_str(&value[plain_from..at]);
        if escape.is_empty() {
            let _ = write!(line, "\\u{byte:04x}");
        } else {
            line.push_str(escape);
        }
        plain_from = at + 1;
    }
    line.push_str(&value[plain_from..]);
}

/// Where the first byte JSON escapes (`"`, `\\`, below U+0020) is, if any:
/// eight bytes at a time while none is, then byte by byte.
fn first_json_special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte of `word` is zero, or below `n` (n ≤ 0x80): its high bit is
    // set in the result (the classic "has a zero byte" test; exact as to
    // whether any byte is, which is all that is asked of it).
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS;
    let zero = |word: u64| below(word, 1);
    let special = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let word = u64::from_ne_bytes(chunk.try_into().expect("eight bytes"));
        let hit = below(word, 0x20)
            | zero(word ^ (ONES * u64::from(b'"')))
            | zero(word ^ (ONES * u64::from(b'\\')));
        if hit != 0
            && let Some(i) = chunk.iter().position(|&b| special(b))
        {
            return Some(at + i);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| special(b))
        .map(|i| at + i)
}

/// Writes through, escaped for the inside of a JSON string.
struct JsonEscaped<'a>(&'a mut String);

impl Write for JsonEscaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        json_escaped(self.0, s);
        Ok(())
    }
}

thread_local! {
    /// The second this thread last wrote a line in, since the epoch, and
    /// its date and time to the second: `2026-12-07T02:53:51.`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// `now` in RFC 3339, UTC, to the microsecond, as `tracing-subscriber`
/// writes it (`2026-12-07T02:53:51.876207Z`; years 1970 to 9999, a clock
/// set before 1970 reads 1970). The date is kept as text, so a line
/// copies it without checking it again.
fn write_timestamp(line: &mut String, now: SystemTime) {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let second = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != second {
            *cached = second;
            text.clear();
            text.push_str(std::str::from_utf8(&date_and_time(second)).expect("ASCII date"));
        }
        line.push_str(text);
    });
    let mut digits = [b'0'; 6];
    let mut micros = since_epoch.subsec_micros();
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    for digit in digits {
        line.push(char::from(digit));
    }
    line.push('Z');
}

/// `YYYY-MM-DDTHH:MM:SS.` of the second `second` since the epoch (the
/// proleptic Gregorian calendar, Howard Hinnant's `civil_from_days`).
fn date_and_time(second: u64) -> [u8; 20] {
    let (days, in_day) = (second / 86_400, second % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let mut text = *b"0000-00-00T00:00:00.";
    let mut put = |at: usize, width: usize, mut value: u64| {
        for digit in text[at..at + width].iter_mut().rev() {
            *digit = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, in_day / 3600);
    put(14, 2, in_day / 60 % 60);
    put(17, 2, in_day % 60);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// The word-at-a-time scan finds what a byte-by-byte one finds: every
    /// byte value at every place of strings around the word size, on a
    /// background of plain bytes and of bytes with the high bit set.
    #[test]
    fn the_json_scan_finds_the_first_byte_to_escape() {
        let by_byte = |bytes: &[u8]| {
            bytes
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        };
        let mut checked = 0;
        for background in [b'a', b'~', 0xc3, 0xff, b' '] {
            for len in 0..=19 {
                for at in 0..len {
                    for byte in 0..=255u8 {
                        let mut bytes = vec![background; len];
                        bytes[at] = byte;
                        assert_eq!(first_json_special(&bytes), by_byte(&bytes), "{bytes:?}");
                        checked += 1;
                    }
                }
                assert_eq!(first_json_special(&vec![background; len]), None);
            }
        }
        assert!(checked > 200_000);
        assert_eq!(first_json_special(b"abcdefgh\\ \""), Some(8));
        assert_eq!(first_json_special(b"ab\n\""), Some(2));
    }

    /// What a subscriber wrote, write by write.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<String>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let text = String::from_utf8(buf.to_vec()).expect("UTF-8");
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(text);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn writes(&self) -> Vec<String> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }

        fn lines(&self) -> Vec<String> {
            self.writes().concat().lines().map(str::to_owned).collect()
        }
    }

    struct Shown(&'static str);
    impl fmt::Display for Shown {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    /// Events of the shapes the gateway logs: strings to quote and escape,
    /// fields absent (`None`), numbers, `%display` values, a message with
    /// an escape sequence.
    fn log_events() {
        let none: Option<u64> = None;
        tracing::info!(target: "idem::request", key = "anon/o-1", decision = "executed",
            fence = Some(1u64), status = Some(201u16), latency_us = 1210u64,
            reason = None::<&str>, "decided");
        tracing::info!(target: "idem::request", key = "t\u{e9}nant/\"o\"\\2\t", decision = "unavailable",
            fence = none, status = Some(503u16), latency_us = 0u64,
            reason = Some("store insert of key \"anon/o-1\" failed:\nlost \u{1b}[31m"), "decided");
        tracing::warn!(target: "idem::store", op = "insert", key = "k", latency_us = u64::MAX,
            error = %Shown("memory store unavailable: \"lost\" (injected)"), "store call failed");
        tracing::info!(target: "idem::admin", action = "fault", rule = %Shown("fail insert 2*"),
            by = "127.0.0.1:5000", delta = -42i64, on = true, debug = ?"a\u{7f}b",
            "fault rule changed \u{1b}[2J");
        tracing::error!(target: "idem", "no fields");
    }

    /// Our layer alone, writing `format` lines into `out`.
    fn ours(format: LogLine, out: &Captured) -> tracing::Dispatch {
        let out = out.clone();
        tracing_subscriber::registry()
            .with(Lines {
                format,
                make: move || out.clone(),
            })
            .into()
    }

    fn lines_of(subscriber: impl FnOnce(Captured) -> tracing::Dispatch) -> Vec<String> {
        let captured = Captured::default();
        tracing::dispatcher::with_default(&subscriber(captured.clone()), log_events);
        captured.lines()
    }

    /// A line with its timestamp taken out, which must be one.
    fn untimed(line: &str, json: bool) -> String {
        let at = if json { "{\"timestamp\":\"".len() } else { 0 };
        let stamp = &line[at..at + 27];
        let shape: String = stamp
            .chars()
            .map(|c| if c.is_ascii_digit() { '9' } else { c })
            .collect();
        assert_eq!(shape, "9999-99-99T99:99:99.999999Z", "{line}");
        format!("{}{}", &line[..at], &line[at + 27..])
    }

    /// Our `format` lines of [`log_events`], each checked against what
    /// `theirs` (tracing-subscriber's own formatter) writes, timestamps aside.
    fn lines_as_theirs(
        format: LogLine,
        theirs: impl FnOnce(Captured) -> tracing::Dispatch,
    ) -> Vec<String> {
        let json = matches!(format, LogLine::Json);
        let ours = lines_of(|out| ours(format, &out));
        let theirs = lines_of(theirs);
        assert_eq!(ours.len(), 5, "{ours:#?}");
        for (ours, theirs) in ours.iter().zip(&theirs) {
            assert_eq!(untimed(ours, json), untimed(theirs, json));
            if json {
                serde_json::from_str::<serde_json::Value>(ours).expect("a JSON object");
            }
        }
        ours
    }

    #[test]
    fn text_lines_are_tracing_subscribers_without_colours() {
        let ours = lines_as_theirs(LogLine::Text, |out| {
            tracing_subscriber::fmt()
                .with_writer(move || out.clone())
                .with_ansi(false)
                .finish()
                .into()
        });
        assert_eq!(
            untimed(&ours[0], false),
            "  INFO idem::request: decided key=\"anon/o-1\" decision=\"executed\" fence=1 status=201 latency_us=1210"
        );
        assert!(ours[3].ends_with("fault rule changed \\x1b[2J action=\"fault\" rule=fail insert 2* by=\"127.0.0.1:5000\" delta=-42 on=true debug=\"a\\u{7f}b\""), "{}", ours[3]);
    }

    #[test]
    fn a_display_value_cannot_drive_the_terminal() {
        let captured = Captured::default();
        tracing::dispatcher::with_default(&ours(LogLine::Text, &captured), || {
            tracing::warn!(target: "idem::store", error = %Shown("a\u{1b}[2Jb\u{9b}c"), "store call failed");
        });
        let line = &captured.lines()[0];
        assert!(
            line.ends_with("store call failed error=a\\x1b[2Jb\\u{9b}c"),
            "{line}"
        );
    }

    /// A value that logs while it is formatted.
    struct Logging;
    impl fmt::Debug for Logging {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            tracing::warn!(target: "idem::store", "logged from inside a value");
            f.write_str("the value")
        }
    }

    /// Lines from many threads cannot interleave in the log: each is one
    /// write of a whole line. A value that logs while it is formatted
    /// breaks nothing (`tracing` drops the event it logs).
    #[test]
    fn each_line_is_one_write_even_with_a_value_that_logs() {
        let captured = Captured::default();
        tracing::dispatcher::with_default(&ours(LogLine::Json, &captured), || {
            tracing::info!(target: "idem::request", key = "anon/o-1", value = ?Logging, "decided");
            tracing::info!(target: "idem::request", key = "anon/o-2", "decided");
        });
        let writes = captured.writes();
        assert_eq!(writes.len(), 2, "{writes:#?}");
        for write in &writes {
            assert!(
                write.ends_with('\n') && write.matches('\n').count() == 1,
                "{write:?}"
            );
            serde_json::from_str::<serde_json::Value>(write).expect("a JSON object");
        }
        assert!(writes[0].contains("\"key\":\"anon/o-1\",\"value\":\"the value\""));
        assert!(writes[1].contains("\"key\":\"anon/o-2\""));
    }

    #[test]
    fn json_lines_are_tracing_subscribers_flattened_json() {
        let ours = lines_as_theirs(LogLine::Json, |out| {
            tracing_subscriber::fmt()
                .with_writer(move || out.clone())
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish()
                .into()
        });
        assert_eq!(
            untimed(&ours[0], true),
            "{\"timestamp\":\"\",\"level\":\"INFO\",\"message\":\"decided\",\"key\":\"anon/o-1\",\"decision\":\"executed\",\"fence\":1,\"status\":201,\"latency_us\":1210,\"target\":\"idem::request\"}"
        );
    }

    #[test]
    fn timestamps_are_rfc_3339_utc_to_the_microsecond() {
        let at = |micros: u64| {
            let mut text = String::new();
            write_timestamp(&mut text, UNIX_EPOCH + Duration::from_micros(micros));
            text
        };
        for (micros, text) in [
            (0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400_000_001, "2000-02-29T00:00:00.000001Z"),
            (1_709_251_199_999_999, "2024-02-29T23:59:59.999999Z"),
            // The next microsecond is the next day: the cached second moves on.
            (1_709_251_200_000_000, "2024-03-01T00:00:00.000000Z"),
            (1_796_615_631_876_207, "2026-12-07T03:53:51.876207Z"),
            (1_798_761_599_500_000, "2026-12-31T23:59:59.500000Z"),
            (253_402_300_799_999_999, "9999-12-31T23:59:59.999999Z"),
        ] {
            assert_eq!(at(micros), text, "{micros} µs after the epoch");
        }
        let mut before_1970 = String::new();
        write_timestamp(&mut before_1970, UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(before_1970, "1970-01-01T00:00:00.000000Z");
    }
}
