//! Child processes for tests and benches: killed on drop, and started on
//! port 0 with the ports they report having bound.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// How long [`spawn_bound`] waits for the lines: a debug build of `idem`
/// compiles the component before it binds, slow on a loaded machine.
const BIND_TIMEOUT: Duration = Duration::from_secs(90);

/// A child process, killed and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    /// SIGKILL now (no destructor, no flush, no clean close), and reap it.
    /// Panics if it had already exited: it was to be killed, not to finish.
    pub fn kill_9(&mut self) {
        self.0.kill().expect("the child is still running");
        let status = self.0.wait().expect("the killed child is reaped");
        assert!(
            !status.success(),
            "the child was killed, not finished: {status:?}"
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command`, whose listeners are on port 0, and returns the ports
/// they bound, one for each of `lines`: the port of the first stderr line
/// starting with each (`idem serve: http://127.0.0.1:PORT …`), whatever
/// order the lines come in. Port 0 leaves nothing to race for between
/// picking a port and binding it, as picking a free port first does. Its stdout goes nowhere;
/// its stderr, these lines included, is passed on to the caller's.
///
/// Panics, naming the command and the line, if the process does not print
/// each line within 90 s.
pub fn spawn_bound<const N: usize>(command: Command, lines: [&'static str; N]) -> (Proc, [u16; N]) {
    spawn(command, lines, None)
}

/// Every stderr line of a process started by [`spawn_logged`], as they
/// come. Clones share them.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    /// The lines so far.
    pub fn all(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The lines, once `pred` holds on them; fails after 40 s, showing them
    /// and naming `what` was awaited.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let lines = self.all();
            if pred(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the lines:\n{}",
                lines.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// [`spawn_bound`], keeping every stderr line for the caller to read (a
/// test of what a server logs).
pub fn spawn_logged<const N: usize>(
    command: Command,
    lines: [&'static str; N],
) -> (Proc, [u16; N], Lines) {
    let kept = Lines::default();
    let (proc, ports) = spawn(command, lines, Some(kept.clone()));
    (proc, ports, kept)
}

fn spawn<const N: usize>(
    mut command: Command,
    lines: [&'static str; N],
    kept: Option<Lines>,
) -> (Proc, [u16; N]) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    let stderr = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let proc = Proc(child);
    let (bound, ports) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { return };
            for (at, prefix) in lines.iter().enumerate() {
                let addr = line
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.split(['/', ' ']).next());
                if let Some(port) = addr.and_then(|a| a.rsplit_once(':')?.1.parse::<u16>().ok()) {
                    let _ = bound.send((at, port));
                }
            }
            eprintln!("{line}");
            if let Some(kept) = &kept {
                kept.0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        }
    });
    let deadline = Instant::now() + BIND_TIMEOUT;
    let mut found: [Option<u16>; N] = [None; N];
    while let Some(missing) = found.iter().position(Option::is_none) {
        match ports.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((at, port)) => {
                found[at].get_or_insert(port);
            }
            Err(e) => panic!("{command:?} did not print {:?}ADDR: {e}", lines[missing]),
        }
    }
    (proc, found.map(|port| port.expect("every line was found")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut sh = Command::new("sh");
        sh.args(["-c", script]);
        sh
    }

    #[test]
    fn each_port_comes_from_its_line_whatever_order_they_are_printed_in() {
        let (mut proc, ports) = spawn_bound(
            sh("echo 'starting' >&2; \
                echo 'admin API: http://127.0.0.1:4243/v1/stats' >&2; \
                echo 'idem serve: http://127.0.0.1:4242 -> up' >&2; \
                exec sleep 30"),
            ["idem serve: http://", "admin API: http://"],
        );
        assert_eq!(ports, [4242, 4243]);
        assert!(proc.0.try_wait().unwrap().is_none(), "still running");
        let pid = proc.0.id();
        drop(proc);
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        assert!(!alive, "killed and reaped on drop");
    }

    #[test]
    fn a_process_that_exits_before_the_line_fails_at_once_naming_it() {
        let started = Instant::now();
        let panic = std::panic::catch_unwind(|| {
            spawn_bound(
                sh("echo 'no such store' >&2; exit 1"),
                ["idem serve: http://"],
            )
        })
        .err()
        .expect("spawn_bound panics");
        assert!(
            started.elapsed() < BIND_TIMEOUT / 2,
            "did not wait out the timeout"
        );
        let message = panic.downcast_ref::<String>().expect("a formatted panic");
        assert!(
            message.contains("did not print \"idem serve: http://\"ADDR"),
            "{message}"
        );
    }
}
