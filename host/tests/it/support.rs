//! What several test modules need to run the real `idem` binary: its path,
//! child processes killed on drop, started on port 0 with the ports they
//! bound, and plain HTTP/1.1 requests.

pub use idem_harness::Proc;
use serde_json::Value;
use std::process::Command;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// `idem ARGS…`, whose listeners are on port 0, and the ports they bound,
/// one for each of `lines` (see [`idem_harness::spawn_bound`]).
pub fn spawn_bound<const N: usize>(args: &[&str], lines: [&'static str; N]) -> (Proc, [u16; N]) {
    let mut idem = Command::new(IDEM);
    idem.args(args);
    idem_harness::spawn_bound(idem, lines)
}

/// `idem serve` with its proxy on port 0 and its admin API on `admin`
/// (`127.0.0.1:0`, another address, or `off`); the caller adds the rest.
pub fn serve(admin: &str) -> Command {
    let mut idem = Command::new(IDEM);
    idem.args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", admin]);
    idem
}

/// `idem serve ARGS…` on port 0 for the proxy and the admin API: the process
/// and those two ports.
pub fn spawn_serve(args: &[&str]) -> (Proc, u16, u16) {
    let mut idem = serve("127.0.0.1:0");
    idem.args(args);
    let (proc, [proxy, admin]) =
        idem_harness::spawn_bound(idem, ["idem serve: http://", "admin API: http://"]);
    (proc, proxy, admin)
}

/// `idem ledger ARGS…` on port 0: the process and its port.
pub fn spawn_ledger(args: &[&str]) -> (Proc, u16) {
    let args = [&["ledger", "--listen", "127.0.0.1:0"], args].concat();
    let (proc, [port]) = spawn_bound(&args, ["idem ledger: http://"]);
    (proc, port)
}

/// The string `field` of each object in the JSON array `list`.
pub fn each_str<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    let items = list
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"));
    items
        .iter()
        .map(|item| item[field].as_str().unwrap())
        .collect()
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

/// `reply` has `status`, and its body says `says`.
pub fn assert_answer(reply: &Reply, status: u16, says: &str) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert!(
        String::from_utf8_lossy(&reply.body).contains(says),
        "{reply:?}"
    );
}

/// `again` is the replay of the 201 `first`: the same bytes, marked replayed.
pub fn assert_replay(again: &Reply, first: &Reply) {
    assert_eq!((again.status, &again.body), (201, &first.body), "{again:?}");
    assert_eq!(
        again.header("idempotent-replayed"),
        Some("true"),
        "{again:?}"
    );
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

/// `POST /orders` of the JSON `body` under the idempotency key `key`.
pub async fn post_order(port: u16, key: &str, body: &str) -> Reply {
    let headers = [
        ("idempotency-key", key),
        ("content-type", "application/json"),
    ];
    http(port, "POST", "/orders", &headers, body).await
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
