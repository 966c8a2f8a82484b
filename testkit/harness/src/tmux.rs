//! A terminal program in a tmux pane, as a person uses it: keys in, the
//! screen read back as text.

use std::process::Command;
use std::time::{Duration, Instant};

/// How long [`Tmux::wait_for`] waits for a screen before it fails: a debug
/// build on a loaded machine can take seconds to draw its first frame.
const PATIENCE: Duration = Duration::from_secs(40);
/// How often the screen is read while waiting, and how long a match must
/// last to count.
const POLL: Duration = Duration::from_millis(100);

/// One pane on a tmux server of its own (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs the shell command line `command` in a fresh detached
    /// `width`×`height` pane (`TERM=xterm-256color`) on a server named after
    /// `name` and this process. Once the command exits, the pane shows
    /// `exit=CODE` and, on the next line, the terminal's `icanon` and `echo`
    /// modes (`-icanon` while still raw), and stays open to be read.
    ///
    /// Panics, saying how to install it, when tmux is missing.
    pub fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        let version = Command::new("tmux").arg("-V").output();
        assert!(
            version.as_ref().is_ok_and(|o| o.status.success()),
            "tmux is required for the terminal tests (apt-get install tmux): {version:?}"
        );
        let tmux = Tmux {
            socket: format!("idem-{name}-{}", std::process::id()),
        };
        let script = format!(
            "{command}; echo \"exit=$?\"; stty -a | tr ' ;' '\\n\\n' | grep -Ex -- '-?(icanon|echo)' | tr '\\n' ' '; echo; sleep 600"
        );
        let (width, height) = (width.to_string(), height.to_string());
        let status = tmux
            .cmd()
            .args(["new-session", "-d", "-x", &width, "-y", &height, "-s", "t"])
            .args(["sh", "-c", &script])
            .env("TERM", "xterm-256color")
            .status()
            .unwrap();
        assert!(status.success(), "tmux new-session failed");
        tmux
    }

    /// `tmux` on this pane's server, for what the methods here do not cover.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    /// The pane's text as it shows now, one line a row.
    pub fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A tmux format expanded for the pane: `#{alternate_on}`,
    /// `#{cursor_flag}`, `#{pane_pid}`, …
    pub fn display(&self, format: &str) -> String {
        let out = self
            .cmd()
            .args(["display-message", "-p", "-t", "t", format])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Types `keys` in turn, each a tmux key name (`Enter`, `Escape`,
    /// `PageDown`) or literal text.
    pub fn keys(&self, keys: &[&str]) {
        for key in keys {
            let sent = self.cmd().args(["send-keys", "-t", "t", key]).status();
            assert!(sent.unwrap().success(), "tmux send-keys {key:?} failed");
        }
    }

    /// Resizes the pane, as a person resizing the terminal window.
    pub fn resize(&self, width: u16, height: u16) {
        let (width, height) = (width.to_string(), height.to_string());
        let resized = self
            .cmd()
            .args(["resize-window", "-t", "t", "-x", &width, "-y", &height])
            .status();
        assert!(resized.unwrap().success(), "tmux resize-window failed");
    }

    /// The screen, once `pred` holds on it; fails after a while, showing
    /// the last screen and naming `what` was awaited.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_for_doing(what, || {}, pred)
    }

    /// [`Tmux::wait_for`] the screen to show `text`.
    pub fn wait_for_text(&self, text: &str) -> String {
        self.wait_for(text, |s| s.contains(text))
    }

    /// Types `q` and waits for the program to exit with code 0, as a
    /// person quits a console; the screen it left.
    pub fn quit(&self) -> String {
        self.keys(&["q"]);
        self.wait_for("the program to exit with code 0", |s| s.contains("exit=0"))
    }

    /// [`Tmux::wait_for`], doing `meanwhile` between reads (sending the
    /// traffic the screen should show, say).
    ///
    /// A frame can be caught half drawn on a loaded machine: the screen
    /// returned is one read a moment after a match, and it must match too
    /// (a console redraws live figures, so the two need not be equal).
    pub fn wait_for_doing(
        &self,
        what: &str,
        mut meanwhile: impl FnMut(),
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = self.screen();
            if pred(&screen) {
                std::thread::sleep(POLL);
                let settled = self.screen();
                if pred(&settled) {
                    return settled;
                }
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            meanwhile();
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}
