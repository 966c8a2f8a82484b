//! Log lines written by a thread of their own, many lines to a `write(2)`.
//!
//! At `info` the gateway logs every guarded request. Written where it is
//! made, each line is a system call on the request's thread, and the
//! threads of a busy gateway queue on the file's lock in the kernel
//! (benchmarks/log.md, "Issue 47"). Here a line is appended to a buffer
//! under a mutex, and one writer thread writes the buffer whole: woken by
//! the first line after a quiet spell, it lets lines gather for up to
//! [`GATHER`] (or until [`WAKE_BYTES`] are waiting), then writes them in one
//! call, and again while lines keep coming. A line costs its thread no
//! system call at all, and a busy gateway one `write(2)` per [`GATHER`].
//!
//! Nothing is dropped. A thread whose line finds [`PENDING_LIMIT`] bytes
//! still unwritten (an output slower than the gateway) waits for the
//! writer, as it would have waited for its own `write(2)`. A `WARN` or
//! `ERROR` line is on the output when its event returns, with every line
//! before it: a store error is never behind a crash. A process killed with
//! `SIGKILL` loses the lines of its last [`GATHER`] at most; a gateway that
//! shuts down on `SIGTERM` or Ctrl-C writes them all ([`Flush`]).
//!
//! ```
//! use idem::cli::{Batched, LogFormat, log_lines};
//! use tracing_subscriber::layer::SubscriberExt as _;
//!
//! let out = Batched::new(std::io::stderr());
//! let flush = out.flush_handle();
//! let subscriber = tracing_subscriber::registry().with(log_lines(LogFormat::Json, out));
//! tracing::subscriber::with_default(subscriber, || tracing::info!(target: "idem::request", "decided"));
//! flush.flush(); // every line made so far is written
//! ```

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Bytes of lines waiting for the writer beyond which a thread with a line
/// waits until the writer has taken them: memory stays bounded however slow
/// the output, and no line is dropped.
pub const PENDING_LIMIT: usize = 1 << 20;

/// How long the writer lets lines gather before it writes them: the most
/// a line waits for its `write(2)`.
pub const GATHER: Duration = Duration::from_millis(10);

/// Bytes of lines waiting that the writer writes without gathering more.
pub const WAKE_BYTES: usize = 64 << 10;

/// A buffer the writer keeps between batches is given back beyond this.
const KEPT_CAPACITY: usize = 64 << 10;

/// Lines handed to a writer thread that writes them to `out` in batches:
/// a [`MakeWriter`] for [`log_lines`](super::log_lines). Dropping it writes
/// the lines still pending and ends the thread.
pub struct Batched {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// Writes every line made so far: [`Flush::flush`], or on drop (held by
/// `idem serve` until it has shut down).
#[derive(Clone)]
pub struct Flush(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// The writer waits on this for lines.
    lines: Condvar,
    /// Threads waiting for lines to be written wait on this.
    written: Condvar,
}

#[derive(Default)]
struct State {
    /// Lines made and not yet taken by the writer, in order.
    pending: Vec<u8>,
    /// The writer is writing a batch it took.
    writing: bool,
    /// The writer waits on `lines` for the first line after a quiet spell
    /// (that line wakes it; while it gathers, lines need not).
    asleep: bool,
    /// Threads waiting on `written` (the writer wakes them after a batch).
    waiting: usize,
    /// No more lines: the writer writes what is pending and ends.
    closed: bool,
}

impl Batched {
    /// A writer thread for `out`, idle until the first line.
    pub fn new<W: Write + Send + 'static>(out: W) -> Batched {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            lines: Condvar::new(),
            written: Condvar::new(),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("idem-log".into())
                .spawn(move || shared.write_batches(out))
                .expect("spawn the log writer thread")
        };
        Batched {
            shared,
            writer: Some(writer),
        }
    }

    /// A handle that writes every line made so far, for whoever shuts the
    /// process down (the subscriber holding this is never dropped).
    pub fn flush_handle(&self) -> Flush {
        Flush(Arc::clone(&self.shared))
    }
}

impl Drop for Batched {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.closed = true;
            self.shared.wake_writer(&mut state, true);
        }
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Flush {
    /// Returns once every line made before the call is written.
    pub fn flush(&self) {
        self.0.flush();
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.flush();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the writer if it sleeps, or, `urgent`, if it gathers lines.
    /// A line's thread makes no system call while the writer is busy.
    fn wake_writer(&self, state: &mut State, urgent: bool) {
        if state.asleep || urgent {
            state.asleep = false;
            self.lines.notify_one();
        }
    }

    fn wait_written<'a>(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        state.waiting += 1;
        state = self
            .written
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
        state.waiting -= 1;
        state
    }

    /// Appends `line`, after waiting while too much is pending.
    fn append<'a>(&'a self, line: &[u8]) -> MutexGuard<'a, State> {
        let mut state = self.lock();
        while state.pending.len() >= PENDING_LIMIT && !state.closed {
            self.wake_writer(&mut state, true);
            state = self.wait_written(state);
        }
        let before = state.pending.len();
        state.pending.extend_from_slice(line);
        let plenty = before < WAKE_BYTES && state.pending.len() >= WAKE_BYTES;
        self.wake_writer(&mut state, plenty);
        state
    }

    /// Returns once every line made before the call is written.
    fn flush(&self) {
        drop(self.written_all(self.lock()));
    }

    /// Waits until nothing made before is unwritten.
    fn written_all<'a>(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while (state.writing || !state.pending.is_empty()) && !state.closed {
            self.wake_writer(&mut state, true);
            state = self.wait_written(state);
        }
        state
    }

    /// The writer thread: asleep until a line comes, then lets lines
    /// gather for up to [`GATHER`], takes them all, writes them with the
    /// lock released, and again, until closed with nothing pending.
    fn write_batches<W: Write>(&self, mut out: W) {
        let mut batch = Vec::new();
        let mut state = self.lock();
        loop {
            while state.pending.is_empty() {
                if state.closed {
                    return;
                }
                state.asleep = true;
                state = self
                    .lines
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.asleep = false;
            }
            let gathered = Instant::now() + GATHER;
            loop {
                let urgent = state.closed || state.waiting > 0 || state.pending.len() >= WAKE_BYTES;
                let now = Instant::now();
                if urgent || now >= gathered {
                    break;
                }
                state = self
                    .lines
                    .wait_timeout(state, gathered - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::swap(&mut state.pending, &mut batch);
            state.writing = true;
            drop(state);
            // As `tracing-subscriber` does, lines that cannot be written
            // are dropped: there is nowhere left to say so.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            batch.clear();
            if batch.capacity() > KEPT_CAPACITY {
                batch = Vec::new();
            }
            state = self.lock();
            state.writing = false;
            if state.waiting > 0 {
                self.written.notify_all();
            }
        }
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            shared: &self.shared,
            wait: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line<'a> {
        Line {
            shared: &self.shared,
            wait: matches!(*meta.level(), Level::WARN | Level::ERROR),
        }
    }
}

/// One line's writer: appends what it is given to the pending lines (and,
/// for a `WARN` or `ERROR` line, returns once it is written).
pub struct Line<'a> {
    shared: &'a Shared,
    wait: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let state = self.shared.append(line);
        if self.wait {
            drop(self.shared.written_all(state));
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::time::Duration;

    /// An output that records each `write` call, optionally held shut
    /// until the test opens it.
    #[derive(Clone, Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<Vec<u8>>>>,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Recorder {
        fn shut() -> Recorder {
            let recorder = Recorder::default();
            *recorder.gate.0.lock().unwrap() = true;
            recorder
        }

        fn open(&self) {
            *self.gate.0.lock().unwrap() = false;
            self.gate.1.notify_all();
        }

        fn bytes(&self) -> Vec<u8> {
            self.calls.lock().unwrap().concat()
        }

        fn calls(&self) -> usize {
            self.calls.lock().unwrap().len()
        }
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (shut, opened) = &*self.gate;
            let mut shut = shut.lock().unwrap();
            while *shut {
                shut = opened.wait(shut).unwrap();
            }
            self.calls.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(thread: usize, n: usize) -> String {
        format!("thread={thread} line={n} {}\n", "x".repeat(n % 200))
    }

    #[test]
    fn every_line_is_written_once_and_in_each_threads_order() {
        let out = Recorder::default();
        let batched = Batched::new(out.clone());
        let flush = batched.flush_handle();
        std::thread::scope(|s| {
            for t in 0..4 {
                let batched = &batched;
                s.spawn(move || {
                    for n in 0..5000 {
                        batched
                            .make_writer()
                            .write_all(line(t, n).as_bytes())
                            .unwrap();
                    }
                });
            }
        });
        flush.flush();
        let text = String::from_utf8(out.bytes()).unwrap();
        let mut next = [0usize; 4];
        for l in text.lines() {
            let (t, n) = l
                .split_once(' ')
                .map(|(t, rest)| {
                    let n = rest.split(' ').next().unwrap();
                    (
                        t["thread=".len()..].parse::<usize>().unwrap(),
                        n["line=".len()..].parse::<usize>().unwrap(),
                    )
                })
                .unwrap();
            assert_eq!(n, next[t], "thread {t}'s lines out of order or lost");
            assert_eq!(format!("{l}\n"), line(t, n), "a line torn");
            next[t] += 1;
        }
        assert_eq!(next, [5000; 4], "every line written once");
        assert!(out.calls() <= 20_000, "at most a write per line");
    }

    #[test]
    fn a_line_is_written_without_a_flush() {
        let out = Recorder::default();
        let batched = Batched::new(out.clone());
        batched.make_writer().write_all(b"alone\n").unwrap();
        // The writer, asleep, is woken by the line and writes it after
        // gathering for GATHER: no flush, no further line needed.
        let deadline = std::time::Instant::now() + Duration::from_mins(1);
        while out.bytes().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the line was never written"
            );
            std::thread::sleep(GATHER);
        }
        assert_eq!(out.bytes(), b"alone\n");
        drop(batched);
    }

    #[test]
    fn lines_made_while_the_writer_writes_go_out_in_one_call() {
        let out = Recorder::shut();
        let batched = Batched::new(out.clone());
        batched.make_writer().write_all(b"first\n").unwrap();
        // The writer has taken "first" and is held in its write; these gather.
        for n in 0..100 {
            batched
                .make_writer()
                .write_all(format!("gathered {n}\n").as_bytes())
                .unwrap();
        }
        out.open();
        batched.flush_handle().flush();
        let calls = out.calls.lock().unwrap().clone();
        let joined: Vec<u8> = calls.concat();
        assert!(joined.starts_with(b"first\ngathered 0\n"));
        assert!(joined.ends_with(b"gathered 99\n"));
        assert!(calls.len() <= 2, "101 lines in {} writes", calls.len());
    }

    #[test]
    fn a_warning_is_written_when_its_event_returns() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let out = Recorder::default();
        let batched = Batched::new(out.clone());
        let lines = crate::cli::log_lines(crate::cli::LogFormat::Text, batched);
        let subscriber = tracing_subscriber::registry().with(lines);
        tracing::subscriber::with_default(subscriber, || {
            for n in 0..50 {
                tracing::info!(target: "idem::request", n, "decided");
            }
            tracing::warn!(target: "idem::store", "the store did not answer");
            // No flush: the warning and every line before it are out.
            let text = String::from_utf8(out.bytes()).unwrap();
            assert_eq!(text.lines().count(), 51, "{text}");
            let last = text.lines().last().unwrap();
            assert!(
                last.ends_with("WARN idem::store: the store did not answer"),
                "{text}"
            );
        });
    }

    #[test]
    fn a_slow_output_holds_back_the_lines_not_drops_them() {
        let out = Recorder::shut();
        let batched = Batched::new(out.clone());
        let line = vec![b'x'; 1023];
        let barrier = Barrier::new(2);
        std::thread::scope(|s| {
            let maker = s.spawn(|| {
                barrier.wait();
                // 3 MiB against a writer held shut: past the limit this
                // thread waits for the writer, so it cannot finish.
                for _ in 0..3 * 1024 {
                    let mut l = line.clone();
                    l.push(b'\n');
                    batched.make_writer().write_all(&l).unwrap();
                }
            });
            barrier.wait();
            // Past the limit the maker waits for the writer (held shut).
            let deadline = std::time::Instant::now() + Duration::from_mins(1);
            while batched.shared.lock().waiting == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the maker never waited"
                );
                std::thread::yield_now();
            }
            assert!(
                !maker.is_finished(),
                "3 MiB went into the buffer of a writer held shut"
            );
            let pending = batched.shared.lock().pending.len();
            assert!(pending <= PENDING_LIMIT + 1024, "{pending} bytes pending");
            out.open();
            maker.join().unwrap();
        });
        drop(batched); // dropping writes what is pending
        assert_eq!(out.bytes().len(), 3 * 1024 * 1024, "every byte written");
    }
}
