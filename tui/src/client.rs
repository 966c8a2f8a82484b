//! The admin API client, and the tasks that feed the console.
//!
//! [`Session::start`] spawns three tasks: a poller (keys page, stats,
//! faults, the watched key's detail and the open history — once a second
//! and at once when the console asks), the event stream reader (decisions,
//! fault changes, operators' actions as they happen, reconnecting by
//! itself), and the command runner (operator actions). They report through one bounded channel of [`Update`]s, so the
//! console's memory stays flat however busy the server is.

use crate::api::{
    Event, FaultRule, Faults, KEEP_ALIVE, KeyDetail, KeyHistory, KeyInfo, KeyPage, Op, Problem,
    SetFaults, Stats,
};
use crate::protocol::{Command, KeyQuery, Update};
use futures_util::StreamExt;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;

/// How often the console polls; leases count down locally in between.
pub const POLL: Duration = Duration::from_secs(1);
/// A poll that takes longer than this counts as a lost connection.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Three missed keep-alives mean the stream is dead.
const STREAM_SILENCE: Duration = KEEP_ALIVE.saturating_mul(3);
/// A single SSE line longer than this is dropped rather than buffered.
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad admin URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("cannot reach the admin API: {0}")]
    Transport(String),
    /// The server answered with a problem; `detail` says why.
    #[error("{status}: {detail}")]
    Refused { status: u16, detail: String },
    #[error("unexpected answer from the admin API: {0}")]
    Decode(String),
}

fn transport(e: &reqwest::Error) -> ClientError {
    // The innermost cause names the problem ("Connection refused"); the outer
    // layers only say "error sending request".
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = cause.to_string();
        source = cause.source();
    }
    if e.is_timeout() {
        text = "timed out".into();
    }
    ClientError::Transport(text)
}

/// A typed admin API v1 client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Client {
    /// `admin_url` is where the admin listener is, e.g. `http://127.0.0.1:9090`.
    pub fn new(admin_url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let bad = |why: &str| ClientError::BadUrl {
            url: admin_url.to_owned(),
            why: why.to_owned(),
        };
        if !admin_url.contains("://") {
            return Err(bad(&format!("no scheme; write it as http://{admin_url}")));
        }
        let base = Url::parse(admin_url).map_err(|e| bad(&e.to_string()))?;
        match base.scheme() {
            "http" => {}
            "https" => {
                return Err(bad(
                    "https is not supported: the admin API listens on plain http (loopback by default)",
                ));
            }
            other => return Err(bad(&format!("scheme {other:?} is not http"))),
        }
        if base.cannot_be_a_base() || base.host().is_none() {
            return Err(bad("no host"));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(REQUEST_TIMEOUT)
            .read_timeout(STREAM_SILENCE)
            .build()
            .map_err(|e| transport(&e))?;
        Ok(Client {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked in new")
            .pop_if_empty()
            .extend(segments);
        url
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Vec<u8>, ClientError> {
        let response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| transport(&e))?.to_vec();
        if status.is_success() {
            return Ok(body);
        }
        let detail = match serde_json::from_slice::<Problem>(&body) {
            Ok(p) if !p.detail.is_empty() => p.detail,
            Ok(p) if !p.title.is_empty() => p.title,
            _ => String::from_utf8_lossy(&body[..body.len().min(200)])
                .trim()
                .to_owned(),
        };
        let detail = if detail.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            detail
        };
        Err(ClientError::Refused {
            status: status.as_u16(),
            detail,
        })
    }

    async fn get_json<T: DeserializeOwned>(&self, url: Url) -> Result<T, ClientError> {
        let body = self.send(self.request(Method::GET, url)).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn keys(&self, query: &KeyQuery) -> Result<KeyPage, ClientError> {
        let mut url = self.url(&["v1", "keys"]);
        let params = serde_urlencoded::to_string(query.params())
            .expect("text and numbers make a query string");
        url.set_query(Some(&params));
        self.get_json(url).await
    }

    /// `None` when the key does not exist (any more).
    pub async fn key(&self, key: &str) -> Result<Option<KeyDetail>, ClientError> {
        match self.get_json(self.url(&["v1", "keys", key])).await {
            Err(ClientError::Refused { status: 404, .. }) => Ok(None),
            other => other.map(Some),
        }
    }

    /// What the gateway kept of `key`'s history.
    pub async fn history(&self, key: &str) -> Result<KeyHistory, ClientError> {
        self.get_json(self.url(&["v1", "keys", key, "history"]))
            .await
    }

    pub async fn release(&self, key: &str) -> Result<KeyInfo, ClientError> {
        let body = self
            .send(self.request(Method::POST, self.url(&["v1", "keys", key, "release"])))
            .await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn expire(&self, key: &str) -> Result<(), ClientError> {
        self.send(self.request(Method::POST, self.url(&["v1", "keys", key, "expire"])))
            .await
            .map(drop)
    }

    pub async fn delete(&self, key: &str) -> Result<(), ClientError> {
        self.send(self.request(Method::DELETE, self.url(&["v1", "keys", key])))
            .await
            .map(drop)
    }

    pub async fn faults(&self) -> Result<Faults, ClientError> {
        self.get_json(self.url(&["v1", "faults"])).await
    }

    /// Sets one operation's rule; the others stay as they are.
    pub async fn set_fault(&self, op: Op, rule: &FaultRule) -> Result<Faults, ClientError> {
        let body = SetFaults::one(op, rule.clone());
        let request = self
            .request(Method::PUT, self.url(&["v1", "faults"]))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_string(&body).map_err(|e| ClientError::Decode(e.to_string()))?);
        let answer = self.send(request).await?;
        serde_json::from_slice(&answer).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.get_json(self.url(&["v1", "stats"])).await
    }

    /// Reads `GET /v1/events` until it ends, sending each decision and fault
    /// change to `updates`.
    pub async fn events(&self, updates: &mpsc::Sender<Update>) -> Result<(), ClientError> {
        let response = self
            .request(Method::GET, self.url(&["v1", "events"]))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| transport(&e))?;
        if response.status() != StatusCode::OK {
            return Err(ClientError::Refused {
                status: response.status().as_u16(),
                detail: "the event stream was refused".into(),
            });
        }
        let mut parser = SseParser::default();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| transport(&e))?;
            for event in parser.push(&chunk) {
                if let Some(update) = decode_event(&event)
                    && updates.send(update).await.is_err()
                {
                    return Ok(());
                }
            }
        }
        Err(ClientError::Transport("the event stream ended".into()))
    }
}

/// One server-sent event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// An incremental `text/event-stream` parser: bytes in, whole events out,
/// however the bytes were split into chunks.
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    oversized: bool,
    event: String,
    data: Option<String>,
}

impl SseParser {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                if !std::mem::take(&mut self.oversized) {
                    let line = String::from_utf8_lossy(&line);
                    if let Some(event) = self.line_done(line.strip_suffix('\r').unwrap_or(&line)) {
                        events.push(event);
                    }
                }
            } else if self.line.len() < MAX_SSE_LINE {
                self.line.push(byte);
            } else {
                self.oversized = true;
            }
        }
        events
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            return self.data.take().map(|data| SseEvent {
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event
                },
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

/// Turns an SSE event into what the console shows; unknown events are skipped.
pub fn decode_event(event: &SseEvent) -> Option<Update> {
    match Event::decode(&event.event, &event.data)? {
        Event::Decision(decision) => Some(Update::Decision(decision)),
        Event::Fault(fault) => Some(Update::Fault(fault)),
        other => Some(Update::Event(other)),
    }
}

/// The running client: send [`Command`]s, receive [`Update`]s.
pub struct Session {
    pub commands: mpsc::UnboundedSender<Command>,
    pub updates: mpsc::Receiver<Update>,
    tasks: JoinSet<()>,
}

impl Session {
    pub fn start(client: Client, query: KeyQuery) -> Session {
        let (updates_tx, updates) = mpsc::channel(256);
        let (commands, mut commands_rx) = mpsc::unbounded_channel::<Command>();
        let (query_tx, query_rx) = watch::channel(query);
        let (watch_tx, watch_rx) = watch::channel::<Option<String>>(None);
        let (history_tx, history_rx) = watch::channel::<Option<String>>(None);
        let wake = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();

        tasks.spawn(poll(
            client.clone(),
            query_rx,
            Watched {
                detail: watch_rx,
                history: history_rx,
            },
            wake.clone(),
            updates_tx.clone(),
        ));
        tasks.spawn(stream(client.clone(), updates_tx.clone()));
        tasks.spawn(async move {
            while let Some(command) = commands_rx.recv().await {
                let update = match command {
                    Command::Query(q) => {
                        query_tx.send_replace(q);
                        wake.notify_one();
                        continue;
                    }
                    Command::Watch(key) => {
                        watch_tx.send_replace(key);
                        wake.notify_one();
                        continue;
                    }
                    Command::History(key) => {
                        history_tx.send_replace(key);
                        wake.notify_one();
                        continue;
                    }
                    // The terminal's business, done by the shell (`run`).
                    Command::Copy(_) => continue,
                    Command::Release(key) => report(
                        client.release(&key).await,
                        format!("released the lease of {key}"),
                    ),
                    Command::Expire(key) => {
                        report(client.expire(&key).await, format!("expired {key}"))
                    }
                    Command::Delete(key) => {
                        report(client.delete(&key).await, format!("deleted {key}"))
                    }
                    Command::SetFault(op, rule) => match client.set_fault(op, &rule).await {
                        Ok(faults) => {
                            let _ = updates_tx.send(Update::Faults(faults)).await;
                            Update::Done(format!("{op}: {rule}"))
                        }
                        Err(e) => Update::Failed(format!("{op} fault refused: {e}")),
                    },
                };
                if updates_tx.send(update).await.is_err() {
                    return;
                }
                wake.notify_one();
            }
        });
        Session {
            commands,
            updates,
            tasks,
        }
    }

    /// Stops every task and waits for them to end.
    pub async fn shutdown(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

fn report<T>(result: Result<T, ClientError>, done: String) -> Update {
    match result {
        Ok(_) => Update::Done(done),
        Err(e) => Update::Failed(e.to_string()),
    }
}

/// The keys the poller reads besides the page: the detail pane's, the
/// open history's.
struct Watched {
    detail: watch::Receiver<Option<String>>,
    history: watch::Receiver<Option<String>>,
}

async fn poll(
    client: Client,
    query: watch::Receiver<KeyQuery>,
    watched: Watched,
    wake: Arc<Notify>,
    updates: mpsc::Sender<Update>,
) {
    let mut interval = tokio::time::interval(POLL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connected = false;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = wake.notified() => {}
        }
        let query = query.borrow().clone();
        let history_of = watched.history.borrow().clone();
        let watched = watched.detail.borrow().clone();
        let history = async {
            match &history_of {
                Some(key) => client.history(key).await.map(Some),
                None => Ok(None),
            }
        };
        let detail = async {
            match &watched {
                Some(key) => client
                    .key(key)
                    .await
                    .map(|d| d.ok_or_else(|| key.clone()))
                    .map(Some),
                None => Ok(None),
            }
        };
        let (keys, stats, faults, detail, history) = tokio::join!(
            client.keys(&query),
            client.stats(),
            client.faults(),
            detail,
            history
        );
        let batch = match polled(query, keys, stats, faults, detail, history) {
            Ok(mut batch) => {
                if !connected {
                    batch.insert(0, Update::Connected);
                    connected = true;
                }
                batch
            }
            // Retrying cannot fix a refused token: say so, and keep polling
            // in case the server's token changes.
            Err(ClientError::Refused {
                status: code @ (401 | 403),
                detail,
            }) => {
                connected = false;
                vec![Update::Unauthorized {
                    status: code,
                    detail,
                }]
            }
            Err(e) => {
                connected = false;
                vec![Update::Disconnected(e.to_string())]
            }
        };
        for update in batch {
            if updates.send(update).await.is_err() {
                return;
            }
        }
    }
}

/// What one poll tells the console, or why the admin API is out of reach.
/// Stats and faults never touch the store: when they answer, the gateway
/// is there, and a key listing or detail the store cannot give (503) says
/// so in the keys view instead of making the console look disconnected.
fn polled(
    query: KeyQuery,
    keys: Result<KeyPage, ClientError>,
    stats: Result<Stats, ClientError>,
    faults: Result<Faults, ClientError>,
    detail: Result<Option<Result<KeyDetail, String>>, ClientError>,
    history: Result<Option<KeyHistory>, ClientError>,
) -> Result<Vec<Update>, ClientError> {
    let mut batch = vec![Update::Stats(stats?), Update::Faults(faults?)];
    match keys {
        Ok(page) => batch.push(Update::Keys { query, page }),
        Err(ClientError::Refused {
            status: 503,
            detail,
        }) => batch.push(Update::KeysUnavailable(detail)),
        Err(e) => return Err(e),
    }
    match detail {
        Ok(Some(Ok(detail))) => batch.push(Update::Detail(detail)),
        Ok(Some(Err(gone))) => batch.push(Update::DetailGone(gone)),
        Ok(None) | Err(ClientError::Refused { status: 503, .. }) => {}
        Err(e) => return Err(e),
    }
    match history {
        Ok(Some(history)) => batch.push(Update::History(history)),
        Ok(None) | Err(ClientError::Refused { status: 503, .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(batch)
}

async fn stream(client: Client, updates: mpsc::Sender<Update>) {
    loop {
        let _ = client.events(&updates).await;
        if updates.is_closed() {
            return;
        }
        // The poller reports the lost connection; this only retries.
        tokio::time::sleep(POLL).await;
    }
}
