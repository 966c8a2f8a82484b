//! What several test modules need to run the real `idem` binary: its path,
//! child processes killed on drop, free ports, and plain HTTP/1.1 requests.

use serde_json::Value;
use std::process::{Child, Command, Stdio};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

/// `idem serve ARGS…` with `--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`
/// added, and the ports it bound (proxy, admin), read from the lines it
/// prints at start. Port 0 leaves nothing to race for between picking a port
/// and binding it. Its later output is passed on to the test's stderr. A
/// debug build compiles the component before it binds: slow on a loaded
/// machine, hence 90 s.
pub fn spawn_serve(args: &[&str]) -> (Proc, u16, u16) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(IDEM)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let proc = Proc(child);
    let (bound, ports) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let port = |line: &str, prefix: &str| {
            let addr = line.strip_prefix(prefix)?.split(['/', ' ']).next()?;
            addr.rsplit_once(':')?.1.parse::<u16>().ok()
        };
        for line in stderr.lines() {
            let Ok(line) = line else { return };
            if let Some(p) = port(&line, "idem serve: http://") {
                let _ = bound.send(("proxy", p));
            } else if let Some(p) = port(&line, "admin API: http://") {
                let _ = bound.send(("admin", p));
            }
            eprintln!("idem serve: {line}");
        }
    });
    let next = |what: &str| match ports.recv_timeout(std::time::Duration::from_secs(90)) {
        Ok((name, port)) if name == what => port,
        other => panic!("idem serve {args:?} did not print its {what} address: {other:?}"),
    };
    let proxy = next("proxy");
    let admin = next("admin");
    (proc, proxy, admin)
}

/// An HTTP response as read off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One HTTP/1.1 request on a connection of its own.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    read_reply(&mut stream).await
}

pub async fn read_reply(stream: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Reply { status, head, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap().trim(), 16)
            .unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[line_end + 2..line_end + 2 + size]);
        raw = &raw[line_end + 4 + size..];
    }
}
