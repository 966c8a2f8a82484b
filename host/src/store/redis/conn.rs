//! One pipelined connection to a lone Redis or Valkey server, without a
//! task between the caller and the socket.
//!
//! A caller encodes its commands straight into the connection's output
//! buffer, queues one reply slot per command and writes the buffer itself
//! (`try_write`; only a socket that is full hands the rest to a task). One
//! reader task per connection parses the replies in place and hands each to
//! the oldest slot: the server answers in order. So a command costs one
//! write by its caller, a share of one read, and one wake-up of the caller;
//! concurrent callers' commands share writes and reads.
//!
//! A connection that fails (the server closed it, a read or write failed,
//! bytes that are not RESP) is lost whole: every command waiting on it fails
//! as lost (it may have run), and the next command opens a new one. A
//! command that finds its connection lost before it was written was never
//! sent, so it goes on a new connection (the first one after the server
//! comes back succeeds). Timeouts are the caller's: a command whose caller
//! gave up keeps its slot, and its reply is dropped when it comes.

use super::resp::{self, Command, Reply};
use crate::latch::Latch;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::io::{Interest, Ready};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;

/// Bytes a read asks the socket for at least.
const READ_CHUNK: usize = 16 * 1024;

/// Why a command got no reply.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// It never left this process: no connection could be made.
    NotSent(Arc<str>),
    /// The connection was lost after it was written: it may have run.
    Lost(Arc<str>),
}

impl Failure {
    pub(super) fn reason(&self) -> &str {
        match self {
            Failure::NotSent(why) | Failure::Lost(why) => why,
        }
    }
}

/// Where the server listens.
#[derive(Clone, Debug)]
pub(super) enum Address {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(host, port) => write!(f, "{host}:{port}"),
            Address::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A connection to one server, made when first needed and made again
/// whenever it is lost.
pub(super) struct Server {
    address: Address,
    /// Sent first on every new connection (`AUTH` or `HELLO`, `SELECT`):
    /// each must not be refused.
    setup: Vec<Command>,
    live: Mutex<Option<Arc<Live>>>,
    /// Held while connecting, so that concurrent callers make one connection.
    connecting: tokio::sync::Mutex<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(live) = self.live.get_mut().ok().and_then(Option::take) {
            live.lose("the store was closed");
        }
    }
}

impl Server {
    pub(super) fn new(address: Address, setup: Vec<Command>) -> Self {
        Server {
            address,
            setup,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends `commands` in one write and waits for their replies, in order.
    /// A server's refusal is a [`Reply::Error`], not a failure.
    pub(super) async fn ask<const N: usize>(
        &self,
        commands: [&Command; N],
    ) -> Result<[Reply; N], Failure> {
        let live = self.live().await?;
        match live.ask(commands).await {
            // Lost before these were written: they go on a new connection.
            Err(Failure::NotSent(_)) => self.live().await?.ask(commands).await,
            done => done,
        }
    }

    fn current(&self) -> Option<Arc<Live>> {
        let live = self.live.lock().expect("connection lock");
        live.as_ref().filter(|live| !live.lost.is_set()).cloned()
    }

    async fn live(&self) -> Result<Arc<Live>, Failure> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _turn = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let live = self.connect().await.map_err(Failure::NotSent)?;
        let old = self
            .live
            .lock()
            .expect("connection lock")
            .replace(live.clone());
        if let Some(old) = old {
            old.lose("replaced by a new connection");
        }
        Ok(live)
    }

    async fn connect(&self) -> Result<Arc<Live>, Arc<str>> {
        let failed = |e: std::io::Error| -> Arc<str> {
            format!("connecting to {}: {e}", self.address).into()
        };
        let stream = match &self.address {
            Address::Tcp(host, port) => {
                let stream = TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(failed)?;
                // Each command is one small write answered at once: no
                // waiting for more bytes to fill a segment.
                stream.set_nodelay(true).map_err(failed)?;
                Stream::Tcp(stream)
            }
            Address::Unix(path) => Stream::Unix(UnixStream::connect(path).await.map_err(failed)?),
        };
        let live = Arc::new(Live {
            stream,
            pipe: Mutex::new(Pipe::default()),
            lost: Latch::default(),
            reader: OnceLock::new(),
        });
        let reader = tokio::spawn(read(live.clone()));
        let _ = live.reader.set(reader.abort_handle());
        // Lost unless the setup completes (this future may also be dropped
        // by a caller's timeout).
        let unfinished = LoseOnDrop(Some(live.clone()));
        for command in &self.setup {
            match live.ask([command]).await {
                Ok([Reply::Error(refused)]) => {
                    let name = command.args().next().unwrap_or_default();
                    return Err(format!(
                        "{} on connecting to {}: {}",
                        String::from_utf8_lossy(name),
                        self.address,
                        String::from_utf8_lossy(&refused)
                    )
                    .into());
                }
                Ok(_) => {}
                Err(failure) => return Err(failure.reason().into()),
            }
        }
        std::mem::forget(unfinished);
        Ok(live)
    }
}

struct LoseOnDrop(Option<Arc<Live>>);

impl Drop for LoseOnDrop {
    fn drop(&mut self) {
        if let Some(live) = self.0.take() {
            live.lose("connecting did not finish");
        }
    }
}

/// A TCP or Unix socket; both are read and written the same way.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Waits until the socket can be read or written, as `interest` says.
    async fn ready(&self, interest: Interest) -> std::io::Result<Ready> {
        match self {
            Stream::Tcp(s) => s.ready(interest).await,
            Stream::Unix(s) => s.ready(interest).await,
        }
    }

    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(bytes),
            Stream::Unix(s) => s.try_write(bytes),
        }
    }

    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            Stream::Unix(s) => s.try_read_buf(buf),
        }
    }
}

type Slot = oneshot::Sender<Result<Reply, Failure>>;

/// One open connection.
struct Live {
    stream: Stream,
    pipe: Mutex<Pipe>,
    /// Set once, when the connection is lost (as `Pipe::lost`, readable
    /// without the lock), and waited on by a write waiting on the socket.
    lost: Latch,
    reader: OnceLock<tokio::task::AbortHandle>,
}

#[derive(Default)]
struct Pipe {
    /// Commands encoded, not yet handed to the socket.
    out: Vec<u8>,
    /// An empty buffer with room, to swap with `out`.
    spare: Vec<u8>,
    /// Whether a caller (or a task) is writing: then the others only append.
    writing: bool,
    /// One per command written and not yet answered, oldest first.
    waiting: VecDeque<Slot>,
    lost: Option<Arc<str>>,
}

/// What became of a write.
enum Wrote {
    /// All of it, and nothing else is waiting to be written.
    All,
    /// The socket is full: `sent` bytes of `bytes` are written.
    Blocked {
        bytes: Vec<u8>,
        sent: usize,
    },
    Failed,
}

impl Live {
    async fn ask<const N: usize>(
        self: &Arc<Self>,
        commands: [&Command; N],
    ) -> Result<[Reply; N], Failure> {
        let slots = self.submit(commands)?;
        let mut replies = [const { Reply::Nil }; N];
        for (reply, slot) in replies.iter_mut().zip(slots) {
            *reply = slot
                .await
                .map_err(|_| Failure::Lost("the connection was closed".into()))??;
        }
        Ok(replies)
    }

    /// Queues `commands` and writes them, unless another caller is writing:
    /// then that one writes them with its own.
    fn submit<const N: usize>(
        self: &Arc<Self>,
        commands: [&Command; N],
    ) -> Result<[oneshot::Receiver<Result<Reply, Failure>>; N], Failure> {
        let mut pipe = self.pipe.lock().expect("pipe lock");
        if let Some(why) = &pipe.lost {
            return Err(Failure::NotSent(why.clone()));
        }
        let slots = commands.map(|command| {
            command.encode(&mut pipe.out);
            let (slot, reply) = oneshot::channel();
            pipe.waiting.push_back(slot);
            reply
        });
        if pipe.writing {
            return Ok(slots);
        }
        pipe.writing = true;
        let spare = std::mem::take(&mut pipe.spare);
        let bytes = std::mem::replace(&mut pipe.out, spare);
        drop(pipe);
        if let Wrote::Blocked { bytes, sent } = self.write(bytes, 0) {
            // Rare: the server is not reading fast enough. A task finishes
            // the write, so that a caller's timeout never cuts a command
            // in half.
            tokio::spawn(self.clone().write_later(bytes, sent));
        }
        Ok(slots)
    }

    /// Writes `bytes` from `sent` on, then whatever other callers queued
    /// meanwhile, until nothing is left or the socket is full.
    fn write(&self, mut bytes: Vec<u8>, mut sent: usize) -> Wrote {
        loop {
            while sent < bytes.len() {
                match self.stream.try_write(&bytes[sent..]) {
                    Ok(0) => {
                        self.lose("the connection took no more bytes");
                        return Wrote::Failed;
                    }
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return Wrote::Blocked { bytes, sent };
                    }
                    Err(e) => {
                        self.lose(format!("writing: {e}"));
                        return Wrote::Failed;
                    }
                }
            }
            bytes.clear();
            sent = 0;
            let mut pipe = self.pipe.lock().expect("pipe lock");
            if pipe.out.is_empty() {
                pipe.writing = false;
                pipe.spare = bytes;
                return Wrote::All;
            }
            std::mem::swap(&mut pipe.out, &mut bytes);
        }
    }

    async fn write_later(self: Arc<Self>, mut bytes: Vec<u8>, mut sent: usize) {
        loop {
            // Until the socket takes more, or the connection is lost (a
            // server that stops reading keeps no task waiting on it).
            tokio::select! {
                biased;
                () = self.lost.wait() => return,
                writable = self.stream.ready(Interest::WRITABLE) => if let Err(e) = writable {
                    self.lose(format!("writing: {e}"));
                    return;
                },
            }
            match self.write(bytes, sent) {
                Wrote::Blocked {
                    bytes: rest,
                    sent: at,
                } => (bytes, sent) = (rest, at),
                Wrote::All | Wrote::Failed => return,
            }
        }
    }

    /// The connection is unusable: every command waiting fails, and the
    /// next one opens a new connection.
    fn lose(&self, why: impl Into<Arc<str>>) {
        let why = why.into();
        self.lost.set();
        let waiting = {
            let mut pipe = self.pipe.lock().expect("pipe lock");
            pipe.lost.get_or_insert(why.clone());
            std::mem::take(&mut pipe.waiting)
        };
        for slot in waiting {
            let _ = slot.send(Err(Failure::Lost(why.clone())));
        }
        if let Some(reader) = self.reader.get() {
            reader.abort();
        }
    }
}

/// The reader task: replies as they arrive, each to the oldest slot.
async fn read(live: Arc<Live>) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut replies: Vec<Reply> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    loop {
        if buf.capacity() - buf.len() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        if let Err(e) = live.stream.ready(Interest::READABLE).await {
            live.lose(format!("reading: {e}"));
            return;
        }
        match live.stream.try_read_buf(&mut buf) {
            Ok(0) => {
                live.lose("the server closed the connection");
                return;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                live.lose(format!("reading: {e}"));
                return;
            }
        }
        loop {
            match resp::frame_len(&buf) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    if resp::is_push(&frame) {
                        continue;
                    }
                    match resp::read(&frame) {
                        Ok(reply) => replies.push(reply),
                        Err(e) => {
                            live.lose(format!("the server's reply is not RESP: {}", e.0));
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    live.lose(format!("the server's reply is not RESP: {}", e.0));
                    return;
                }
            }
        }
        if replies.is_empty() {
            continue;
        }
        let unasked = {
            let mut pipe = live.pipe.lock().expect("pipe lock");
            if pipe.waiting.len() < replies.len() {
                true
            } else {
                slots.extend(pipe.waiting.drain(..replies.len()));
                false
            }
        };
        if unasked {
            live.lose("the server sent a reply no command waits for");
            return;
        }
        for (slot, reply) in slots.drain(..).zip(replies.drain(..)) {
            let _ = slot.send(Ok(reply));
        }
    }
}
