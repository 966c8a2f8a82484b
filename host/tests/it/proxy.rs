//! A TCP proxy between a store and its real server, owned by one test: it
//! counts round trips and can be cut (the port refuses connections and open
//! ones close, as when the server dies) and restored, without touching the
//! shared server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    listener: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    /// Client-to-server turns: a request that starts after a reply (or first).
    round_trips: AtomicU64,
    connections: Mutex<Vec<JoinHandle<()>>>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await
            .unwrap()
            .next()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy = Proxy {
            addr,
            upstream,
            shared: Arc::default(),
            listener: Mutex::new(None),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&self, listener: TcpListener) {
        let (shared, upstream) = (self.shared.clone(), self.upstream);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let conn = tokio::spawn(pipe(client, server, shared.clone()));
                shared.connections.lock().unwrap().push(conn);
            }
        });
        *self.listener.lock().unwrap() = Some(task);
    }

    /// Requests sent since the last call, counted as round trips.
    pub fn take_round_trips(&self) -> u64 {
        self.shared.round_trips.swap(0, Ordering::SeqCst)
    }

    /// The server "dies": the port refuses connections, open ones close.
    pub fn cut(&self) {
        if let Some(task) = self.listener.lock().unwrap().take() {
            task.abort();
        }
        for conn in self.shared.connections.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// The server is back on the same port.
    pub async fn restore(&self) {
        // Wait until the aborted listener has really released the port.
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::task::yield_now().await,
            }
        };
        self.serve(listener);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

async fn pipe(mut client: TcpStream, mut server: TcpStream, shared: Arc<Shared>) {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let requesting = AtomicBool::new(false);
    // A round trip starts with the first bytes up after an answer came down.
    let up = relay(&mut client_read, &mut server_write, || {
        if !requesting.swap(true, Ordering::SeqCst) {
            shared.round_trips.fetch_add(1, Ordering::SeqCst);
        }
    });
    let down = relay(&mut server_read, &mut client_write, || {
        requesting.store(false, Ordering::SeqCst);
    });
    let _ = tokio::try_join!(up, down);
}

/// Copies `from` to `to` until `from` ends, calling `seen` before each
/// chunk is passed on.
async fn relay(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    seen: impl Fn(),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        seen();
        to.write_all(&buf[..n]).await?;
    }
}
