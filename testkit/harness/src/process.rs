//! Child processes for tests and benches: killed on drop, and started on
//! port 0 with the ports they report having bound.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long [`spawn_bound`] waits for the lines: a debug build of `idem`
/// compiles the component before it binds, slow on a loaded machine.
const BIND_TIMEOUT: Duration = Duration::from_secs(90);

/// A child process, killed and reaped on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command`, whose listeners are on port 0, and returns the ports
/// they bound, one for each of `lines`: the port of the first stderr line
/// starting with each (`idem serve: http://127.0.0.1:PORT …`), in that
/// order. Port 0 leaves nothing to race for between picking a port and
/// binding it, as picking a free port first does. Its stdout goes nowhere;
/// its stderr, these lines included, is passed on to the caller's.
///
/// Panics, naming the command and the line, if the process does not print
/// each line within 90 s.
pub fn spawn_bound<const N: usize>(
    mut command: Command,
    lines: [&'static str; N],
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
            for prefix in lines {
                let addr = line
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.split(['/', ' ']).next());
                if let Some(port) = addr.and_then(|a| a.rsplit_once(':')?.1.parse::<u16>().ok()) {
                    let _ = bound.send((prefix, port));
                }
            }
            eprintln!("{line}");
        }
    });
    let ports = lines.map(|what| match ports.recv_timeout(BIND_TIMEOUT) {
        Ok((prefix, port)) if prefix == what => port,
        other => panic!("{command:?} did not print {what:?}ADDR: {other:?}"),
    });
    (proc, ports)
}
