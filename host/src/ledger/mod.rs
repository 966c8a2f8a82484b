//! `idem ledger`: the seed's ledger as an HTTP service, to put behind the
//! gateway and show exactly-once end to end.
//!
//! `POST /orders` with `{"order":"o-1","sku":"A","qty":1,"cents":1000}`
//! reserves stock and charges once per order id (a repeat of an order id
//! charges nothing more, as in the seed) and counts every execution;
//! `GET /ledger` shows stock, reservations, charges and executions, so a
//! check can tell whether any order ran twice. Behind the gateway each run
//! also records the claim's fence (the `Idempotency-Fence` header), so a check
//! can tell a takeover (a new fence) from two runs under one claim, and when
//! each run started and ended, so a check can tell whether two runs of one
//! order overlapped in time.
//!
//! `POST /fulfilments` is a three-step order — reserve, charge, ship — that
//! guards itself with the library and records a checkpoint after each step
//! (`fulfil.rs`): killed between steps and retried, it continues from the
//! last checkpoint, and each step is applied once. With a books file the
//! books survive the kill too.

mod fulfil;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;

/// One order as clients send it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[allow(clippy::struct_field_names)] // `order` is the wire format's name for the order's id
pub struct Order {
    pub order: String,
    pub sku: String,
    pub qty: i64,
    pub cents: i64,
    /// Simulated work for this order, in milliseconds on top of the
    /// ledger's latency (at most a minute): a slow order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_ms: Option<u64>,
}

/// What the ledger holds, as `GET /ledger` returns it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Books {
    pub stock: i64,
    /// Order id → quantity reserved.
    pub reservations: BTreeMap<String, i64>,
    /// Order id → cents charged.
    pub charges: BTreeMap<String, i64>,
    /// Order id → how many times `POST /orders` ran for it.
    pub executions: BTreeMap<String, u64>,
    /// Order id → the fence of each run that came with one, in arrival order.
    #[serde(default)]
    pub fences: BTreeMap<String, Vec<u64>>,
    /// Order id → every run, in the order they ended.
    #[serde(default)]
    pub runs: BTreeMap<String, Vec<Run>>,
    /// Fulfilment order id → step (`reserve`, `charge`, `ship`) → how many
    /// times that step was applied: exactly once each, if all went right.
    #[serde(default)]
    pub steps: BTreeMap<String, BTreeMap<String, u64>>,
    /// Fulfilment order id → units shipped.
    #[serde(default)]
    pub shipped: BTreeMap<String, i64>,
}

/// One run of `POST /orders` for an order: from the request's arrival to
/// the moment its effect was applied. Times are milliseconds since the Unix
/// epoch on a clock that never goes back (the ledger's start on the wall
/// clock, plus a monotonic clock since), so two runs compare even if the
/// wall clock is stepped.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Run {
    /// The claim's fence (`Idempotency-Fence`), if the run came with one.
    pub fence: Option<u64>,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// Which execution of the order this was (1 for the first): the
    /// `execution` of its response body.
    pub execution: u64,
}

impl Books {
    /// Orders that ran more than once: the ones the gateway failed to protect.
    pub fn repeated(&self) -> Vec<(&str, u64)> {
        self.executions
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.as_str(), *n))
            .collect()
    }
}

/// The ledger service.
#[derive(Clone)]
pub struct Ledger {
    books: Arc<Mutex<Books>>,
    /// Where the books are kept across restarts, if anywhere.
    books_file: Option<Arc<PathBuf>>,
    /// The guard of `POST /fulfilments`.
    guard: Option<crate::Guard>,
    /// Simulated work per order, so concurrent repeats overlap.
    latency: Duration,
    /// The clock of [`Run`]'s times: the wall clock at the start, and a
    /// monotonic clock from there.
    epoch: (Instant, u64),
}

impl Ledger {
    pub fn new(stock: i64, latency: Duration) -> Ledger {
        Ledger {
            books: Arc::new(Mutex::new(Books {
                stock,
                ..Books::default()
            })),
            books_file: None,
            guard: None,
            latency,
            epoch: (
                Instant::now(),
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ),
        }
    }

    /// Milliseconds since the Unix epoch, never going back.
    fn now_ms(&self) -> u64 {
        let since = u64::try_from(self.epoch.0.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch.1.saturating_add(since)
    }

    /// Keeps the books in `path`: loaded from it now if it exists (then
    /// `stock` is the file's), and written to it (atomically: a new file
    /// renamed over the old one, synced) after every change.
    pub fn with_books_file(mut self, path: impl Into<PathBuf>) -> std::io::Result<Ledger> {
        let path = path.into();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let books: Books = serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::other(format!(
                        "{} is not a ledger's books file: {e}",
                        path.display()
                    ))
                })?;
                *self.lock() = books;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("read {}: {e}", path.display()),
                ));
            }
        }
        self.books_file = Some(Arc::new(path));
        Ok(self)
    }

    /// Guards `POST /fulfilments` with `guard` (without one it answers 503).
    #[must_use]
    pub fn with_guard(mut self, guard: crate::Guard) -> Ledger {
        self.guard = Some(guard);
        self
    }

    pub fn books(&self) -> Books {
        self.lock().clone()
    }

    /// Writes the books to the books file, if there is one: a step's effect
    /// is durable once this returns.
    fn save(&self, books: &Books) -> std::io::Result<()> {
        let Some(path) = &self.books_file else {
            return Ok(());
        };
        let json = serde_json::to_vec_pretty(books).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        {
            let mut file = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut file, &json)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path.as_path())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/orders", post(place))
            .route("/ledger", get(books))
            .route("/fulfilments", post(fulfil::fulfil))
            .with_state(self.clone())
    }
}

async fn place(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    order: Result<Json<Order>, axum::extract::rejection::JsonRejection>,
) -> (StatusCode, Json<serde_json::Value>) {
    let Ok(Json(order)) = order else {
        return (
            StatusCode::BAD_REQUEST,
            Json(
                serde_json::json!({"error": "BAD_ORDER", "detail": "expected JSON {\"order\":str,\"sku\":str,\"qty\":int,\"cents\":int}"}),
            ),
        );
    };
    if order.qty < 1
        || order.cents < 0
        || order.order.is_empty()
        || order.work_ms.is_some_and(|ms| ms > 60_000)
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(
                serde_json::json!({"error": "BAD_ORDER", "detail": "qty must be at least 1, cents at least 0, order non-empty, work_ms at most 60000"}),
            ),
        );
    }
    let started_ms = ledger.now_ms();
    let latency = ledger.latency + Duration::from_millis(order.work_ms.unwrap_or(0));
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut books = ledger.lock();
    let execution = {
        let n = books.executions.entry(order.order.clone()).or_default();
        *n += 1;
        *n
    };
    let fence = headers
        .get(crate::server::gate::FENCE_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let run = Run {
        fence,
        started_ms,
        ended_ms: ledger.now_ms(),
        execution,
    };
    books.runs.entry(order.order.clone()).or_default().push(run);
    if let Some(fence) = fence {
        books
            .fences
            .entry(order.order.clone())
            .or_default()
            .push(fence);
    }
    if !books.reservations.contains_key(&order.order) {
        if books.stock < order.qty {
            return (
                StatusCode::CONFLICT,
                Json(
                    serde_json::json!({"error": "OUT_OF_STOCK", "order": order.order, "execution": execution}),
                ),
            );
        }
        books.stock -= order.qty;
        books.reservations.insert(order.order.clone(), order.qty);
        books.charges.insert(order.order.clone(), order.cents);
    }
    let body = serde_json::json!({
        "order": order.order,
        "status": "paid",
        "cents": books.charges[&order.order],
        "stock_left": books.stock,
        "execution": execution,
    });
    if let Err(e) = ledger.save(&books) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": "BOOKS_NOT_SAVED", "detail": e.to_string()})),
        );
    }
    (StatusCode::CREATED, Json(body))
}

async fn books(State(ledger): State<Ledger>) -> Json<Books> {
    Json(ledger.books())
}

/// Serves the ledger on `listener` until `shutdown` resolves.
pub async fn run(
    ledger: Ledger,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, ledger.router())
        .with_graceful_shutdown(shutdown)
        .await
}
