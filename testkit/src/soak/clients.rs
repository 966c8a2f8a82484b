//! The clients: orders planned up front from the seed, each sent by one
//! [`Behaviour`] (retries, duplicates, concurrent copies, reused keys).

use super::chaos::share_of;
use super::check::{OrderLog, Reuse, Seen};
use super::gateways::Gateway;
use super::{COPIES, MAX_BACKOFF, MAX_TRIES, REQUEST_TIMEOUT, SLOW_ORDER_PERCENT, Soak, lock};
use anyhow::Context;
use axum::body::Body;
use axum::http::Request;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a client treats one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Behaviour {
    /// Sends it until it gets a final answer.
    Once,
    /// Gets an answer, then sends it again, as after a lost response: a replay.
    Again,
    /// Sends it to both gateways at once.
    BothGateways,
    /// Sends [`COPIES`] copies at once to alternating gateways.
    Concurrent,
    /// Gets an answer, then sends the same key with another body: 422.
    ReusedKey,
    /// Sends it, and again to the other gateway after half a lease to 1.2
    /// leases, whether or not the first has been answered: a client whose
    /// own timeout is shorter than the gateway's. A copy that comes after a
    /// slow claim's lease meets it still running (issue 16).
    Impatient,
}

impl Behaviour {
    pub(super) fn pick(rng: &mut fastrand::Rng) -> Behaviour {
        match rng.u32(0..100) {
            0..15 => Behaviour::Once,
            15..30 => Behaviour::Impatient,
            30..50 => Behaviour::Again,
            50..70 => Behaviour::BothGateways,
            70..85 => Behaviour::Concurrent,
            _ => Behaviour::ReusedKey,
        }
    }
}

/// One order, decided up front from the seed.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) id: String,
    pub(super) qty: i64,
    pub(super) cents: i64,
    pub(super) behaviour: Behaviour,
    pub(super) gateway: usize,
    /// A slow order's extra work at the ledger.
    pub(super) work_ms: Option<u64>,
    /// When an impatient client sends its copy, in leases.
    pub(super) impatience: f64,
}

impl Plan {
    /// The order's body; `more` asks for another quantity and price (the reused key's other body).
    pub(super) fn body(&self, more: i64) -> String {
        let order = idem::testing::Order {
            order: self.id.clone(),
            sku: "A".into(),
            qty: self.qty + more,
            cents: self.cents + 100 * more,
            work_ms: self.work_ms,
        };
        serde_json::to_string(&order).expect("an order serializes")
    }
}

/// What clients saw, by kind of answer, and what the soak did.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) sent: AtomicU64,
    pub(super) executed: AtomicU64,
    pub(super) replayed: AtomicU64,
    pub(super) in_flight: AtomicU64,
    pub(super) conflict: AtomicU64,
    pub(super) unavailable: AtomicU64,
    pub(super) upstream_failed: AtomicU64,
    pub(super) other: AtomicU64,
    pub(super) connection_errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) gave_up: AtomicU64,
    pub(super) orders_done: AtomicU64,
    pub(super) faults_on: AtomicU64,
    pub(super) faults_off: AtomicU64,
    /// Latency spikes switched on (counted in `faults_on` too).
    pub(super) spikes_on: AtomicU64,
    pub(super) kills: AtomicU64,
    pub(super) pauses: AtomicU64,
    pub(super) clock_steps: AtomicU64,
}

pub(super) fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

pub(super) fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl Tally {
    /// The progress line: `sent=120 2xx=80 …`.
    pub(super) fn line(&self) -> String {
        let counts = [
            ("sent", &self.sent),
            ("2xx", &self.executed),
            ("replayed", &self.replayed),
            ("409", &self.in_flight),
            ("422", &self.conflict),
            ("503", &self.unavailable),
            ("5xx", &self.upstream_failed),
            ("conn_err", &self.connection_errors),
            ("timeouts", &self.timeouts),
        ];
        let fields: Vec<String> = counts
            .iter()
            .map(|(name, count)| format!("{name}={}", get(count)))
            .collect();
        fields.join(" ")
    }
}

/// An answer from a gateway.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) replayed: bool,
    pub(super) retry_after: Duration,
    pub(super) body: Bytes,
}

impl Soak {
    pub(super) async fn send(&self, request: Request<Body>) -> anyhow::Result<Answer> {
        let response = self.http.request(request).await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .map_or(MAX_BACKOFF, Duration::from_secs);
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            replayed,
            retry_after,
            body,
        })
    }

    pub(super) async fn admin_json(
        &self,
        gateway: &Gateway,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", gateway.admin))
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))?;
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.send(request))
            .await
            .context("the admin API did not answer in time")??;
        let value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        Ok((answer.status, value))
    }

    /// One request for order `index`, recorded in its log and the tally.
    pub(super) async fn attempt(
        &self,
        gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let gateway = &self.gateways[gateway];
        let id = lock(log).id.clone();
        let request = Request::post(format!("http://{}/orders", gateway.proxy))
            .header("idempotency-key", format!("\"{id}\""))
            .header("content-type", "application/json")
            .header("authorization", self.authorization.clone())
            .body(Body::from(body.to_owned()))
            .expect("a valid request");
        let mark = gateway.fault_mark();
        let pause_mark = *lock(&gateway.paused);
        gateway.enter(index);
        bump(&self.tally.sent);
        let started = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.send(request)).await;
        gateway.leave(index);
        let under_fault = gateway.disrupted_since(mark);
        let paused = lock(&gateway.paused).since(pause_mark);
        let mut log = lock(log);
        log.under_fault |= under_fault;
        log.at_pause |= paused;
        log.slow |= started.elapsed() > self.upstream_timeout;
        let answer = match result {
            Err(_) => {
                bump(&self.tally.timeouts);
                log.slow = true;
                return None;
            }
            Ok(Err(_)) => {
                bump(&self.tally.connection_errors);
                return None;
            }
            Ok(Ok(answer)) => answer,
        };
        let counter = match (answer.status, answer.replayed) {
            (200..=299, false) => &self.tally.executed,
            (200..=299, true) => &self.tally.replayed,
            (409, _) => &self.tally.in_flight,
            (422, _) => &self.tally.conflict,
            (503, _) => &self.tally.unavailable,
            (500..=599, _) => {
                log.slow = true;
                &self.tally.upstream_failed
            }
            _ => &self.tally.other,
        };
        bump(counter);
        if (200..300).contains(&answer.status) {
            log.bodies.push(Seen {
                body: answer.body.to_vec(),
                replayed: answer.replayed,
            });
        }
        Some(answer)
    }

    /// Sends until a final answer: 409, 5xx, connection errors and timeouts
    /// are retried with backoff, at the other gateway after a failure to
    /// connect. `None` after [`MAX_TRIES`].
    pub(super) async fn place(
        &self,
        first_gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let mut gateway = first_gateway;
        for attempt in 0..MAX_TRIES {
            let pause = match self.attempt(gateway, index, body, log).await {
                Some(answer) if answer.status == 409 || answer.status >= 500 => {
                    answer.retry_after.min(MAX_BACKOFF)
                }
                Some(answer) => return Some(answer),
                None => {
                    gateway = (gateway + 1) % self.gateways.len();
                    (Duration::from_millis(10) * 2u32.pow(attempt.min(5))).min(MAX_BACKOFF)
                }
            };
            // Jitter, so retries of concurrent copies spread out.
            tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64())).await;
        }
        bump(&self.tally.gave_up);
        None
    }

    /// Places the order's own body, recording the final status.
    pub(super) async fn place_order(
        &self,
        gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let answer = self.place(gateway, index, body, log).await;
        if let Some(answer) = &answer {
            lock(log).status = Some(answer.status);
        }
        answer
    }

    pub(super) async fn order(&self, index: usize, plan: &Plan) -> OrderLog {
        let log = Mutex::new(OrderLog {
            id: plan.id.clone(),
            qty: plan.qty,
            cents: plan.cents,
            ..OrderLog::default()
        });
        let body = plan.body(0);
        let other = (plan.gateway + 1) % self.gateways.len();
        match plan.behaviour {
            Behaviour::Once => {
                self.place_order(plan.gateway, index, &body, &log).await;
            }
            Behaviour::Again => {
                if self
                    .place_order(plan.gateway, index, &body, &log)
                    .await
                    .is_some()
                {
                    self.place_order(other, index, &body, &log).await;
                }
            }
            Behaviour::BothGateways => {
                futures_util::future::join(
                    self.place_order(plan.gateway, index, &body, &log),
                    self.place_order(other, index, &body, &log),
                )
                .await;
            }
            Behaviour::Concurrent => {
                futures_util::future::join_all((0..COPIES).map(|copy| {
                    let gateway = (plan.gateway + copy) % self.gateways.len();
                    self.place_order(gateway, index, &body, &log)
                }))
                .await;
            }
            Behaviour::Impatient => {
                let after = self.lease.mul_f64(plan.impatience);
                futures_util::future::join(
                    self.place_order(plan.gateway, index, &body, &log),
                    async {
                        tokio::time::sleep(after).await;
                        self.place_order(other, index, &body, &log).await
                    },
                )
                .await;
            }
            Behaviour::ReusedKey => {
                // Only once the key is known to be claimed: a key no request
                // ever claimed is free for any body.
                if self
                    .place_order(plan.gateway, index, &body, &log)
                    .await
                    .is_some()
                {
                    self.reuse(other, index, plan, &log).await;
                }
            }
        }
        log.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the order's key with another body (more units, another price).
    pub(super) async fn reuse(
        &self,
        gateway: usize,
        index: usize,
        plan: &Plan,
        log: &Mutex<OrderLog>,
    ) {
        let body = plan.body(1);
        let answer = self.place(gateway, index, &body, log).await;
        lock(log).reuse = answer.map_or(Reuse::Unanswered, |a| Reuse::Answered(a.status));
    }
}

/// The orders, decided up front from the seed; `run_id` keeps their ids apart from other runs'.
/// One order in four is slow: 40–60 % of the `lease` at the ledger, besides its latency.
pub(super) fn plans(orders: usize, seed: u64, run_id: u32, lease: Duration) -> Vec<Plan> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..orders)
        .map(|i| Plan {
            id: format!("soak-{run_id:08x}-{i:05}"),
            qty: rng.i64(1..=3),
            cents: 500 + rng.i64(0..200) * 5,
            behaviour: Behaviour::pick(&mut rng),
            gateway: rng.usize(..2),
            work_ms: (rng.u32(0..4) == 0).then(|| {
                let work = share_of(lease, rng.u32(SLOW_ORDER_PERCENT));
                u64::try_from(work.as_millis()).unwrap_or(u64::MAX)
            }),
            impatience: 0.5 + 0.7 * rng.f64(),
        })
        .collect()
}
