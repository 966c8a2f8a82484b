//! The operator console end to end, as a person uses it: the real `idem`
//! binary serving (`idem ledger` behind `idem serve`) with traffic, and
//! `idem tui` in a tmux pane driven by keys. Keys appear; the insert fault,
//! flipped from the keyboard, turns requests into 503s and unavailable
//! decisions; flipped back, requests succeed; `q` exits cleanly.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three distinct free ports: the listeners are held together while they are
/// picked, so the kernel cannot hand back one it just released.
fn free_ports() -> [u16; 3] {
    let held = [(); 3].map(|()| TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|listener| listener.local_addr().unwrap().port())
}

fn spawn(args: &[&str]) -> Proc {
    Proc(
        Command::new(IDEM)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// One HTTP/1.1 request; returns the status code (0 if the server is not up yet).
fn post(port: u16, key: &str, body: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: \"{key}\"\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn order(key: &str) -> String {
    format!(r#"{{"order":"{key}","sku":"A","qty":1,"cents":1000}}"#)
}

struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        let version = Command::new("tmux").arg("-V").output();
        assert!(
            version.as_ref().is_ok_and(|o| o.status.success()),
            "tmux is required for the console test (apt-get install tmux): {version:?}"
        );
        let tmux = Tmux {
            socket: format!("idem-console-{}", std::process::id()),
        };
        let script = format!("{command}; echo \"exit=$?\"; sleep 600");
        let ok = tmux
            .cmd()
            .args([
                "new-session",
                "-d",
                "-x",
                "120",
                "-y",
                "40",
                "-s",
                "t",
                "sh",
                "-c",
                &script,
            ])
            .env("TERM", "xterm-256color")
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux new-session failed");
        tmux
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for key in keys {
            assert!(
                self.cmd()
                    .args(["send-keys", "-t", "t", key])
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }

    /// Polls the screen until `pred` holds, doing `meanwhile` between polls.
    fn wait_for(
        &self,
        what: &str,
        mut meanwhile: impl FnMut(),
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            meanwhile();
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

#[test]
fn console_on_a_real_server_shows_keys_and_flips_the_store_fault() {
    let [ledger_port, proxy_port, admin_port] = free_ports();
    let _ledger = spawn(&["ledger", "--listen", &format!("127.0.0.1:{ledger_port}")]);
    let _serve = spawn(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{proxy_port}"),
        "--upstream",
        &format!("http://127.0.0.1:{ledger_port}"),
        "--store",
        "memory:",
        "--admin-listen",
        &format!("127.0.0.1:{admin_port}"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while post(proxy_port, "console-0", &order("console-0")) / 100 != 2 {
        assert!(Instant::now() < deadline, "idem serve never answered 2xx");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 1..5 {
        let key = format!("console-{i}");
        assert_eq!(post(proxy_port, &key, &order(&key)) / 100, 2);
    }

    let tmux = Tmux::start(&format!("{IDEM} tui --admin http://127.0.0.1:{admin_port}"));
    tmux.wait_for(
        "the keys from the live server",
        || {},
        |s| s.contains("console-3") && s.contains("connected"),
    );

    // Flip the insert fault on from the keyboard: the gateway answers 503 and
    // the console's decision log shows unavailable outcomes.
    tmux.keys(&["2"]);
    tmux.wait_for("the faults view", || {}, |s| s.contains("Store faults"));
    tmux.keys(&["j", "e"]);
    tmux.wait_for(
        "the insert fault on",
        || {},
        |s| s.contains("insert → error"),
    );
    let mut n = 100;
    let mut statuses = Vec::new();
    tmux.keys(&["3"]);
    tmux.wait_for(
        "unavailable decisions in the activity view",
        || {
            n += 1;
            let key = format!("console-{n}");
            statuses.push(post(proxy_port, &key, &order(&key)));
        },
        |s| s.contains("UNAVAILABLE"),
    );
    assert!(
        statuses.contains(&503),
        "the gateway failed closed: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 503),
        "no request got through the faulty store: {statuses:?}"
    );

    // And off again: requests succeed.
    tmux.keys(&["2", "Space"]);
    tmux.wait_for(
        "the insert fault off",
        || {},
        |s| s.contains("insert → off"),
    );
    assert_eq!(
        post(proxy_port, "console-after", &order("console-after")) / 100,
        2
    );

    tmux.keys(&["q"]);
    tmux.wait_for(
        "the console to exit cleanly",
        || {},
        |s| s.contains("exit=0"),
    );
}
