//! What several test modules need to run the real `idem` binary: its path,
//! child processes killed on drop, and free ports.

use std::process::{Child, Command, Stdio};

pub const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `N` distinct free ports: the listeners are held together while they are
/// picked, so the kernel cannot hand back one it just released.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held = [(); N].map(|()| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|listener| listener.local_addr().unwrap().port())
}

/// `idem ARGS…`, its output discarded.
pub fn spawn_idem(args: &[&str]) -> Proc {
    Proc(
        Command::new(IDEM)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}
