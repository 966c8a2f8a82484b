//! Keyless slow clients beside the soak's traffic: each sends a `POST
//! /orders` without `Idempotency-Key` (forwarded unguarded: the gateways run
//! with `--require-key false`) announcing a 100,000-byte body, sends its
//! first bytes and then nothing, waits for the answer and starts again. The
//! gateway streams such a body to the ledger under its body deadlines and
//! cuts it with 408 once it falls under the minimum rate; past
//! `--max-concurrent-unguarded` at once they get 503. They are more than
//! the unguarded slots, so those are taken all the time, and the soak's
//! keyed orders must go on as if they were not there: no keyed request may
//! be refused for want of a slot (a violation), and none of theirs runs an
//! order (the ledger's books would show an order no plan has).

use super::Soak;
use super::clients::bump;
use super::gateways::{Gateway, Totals};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Each gateway's slots for unguarded requests: fewer than the slow
/// clients sent to it, so they are all taken while the soak runs.
pub(super) const UNGUARDED_SLOTS: usize = 16;

/// How long a slow client waits for its answer: the body deadline (2 s of
/// grace, then the minimum rate) and a loaded machine's slack.
const ANSWER_WITHIN: Duration = Duration::from_mins(1);

/// What the slow clients were told.
#[derive(Default)]
pub(super) struct SlowTally {
    pub(super) sent: AtomicU64,
    /// Cut with 408 at the body deadline.
    pub(super) cut: AtomicU64,
    /// Refused with 503: every unguarded slot was taken.
    pub(super) shed: AtomicU64,
    /// Any other answer.
    pub(super) other: AtomicU64,
    /// No answer: the gateway was killed or stopped, or the connection broke.
    pub(super) broken: AtomicU64,
}

/// The violation, if any keyed request was refused for want of a slot
/// (in every gateway process's counts, killed ones included).
pub(super) fn shut_out(totals: &Totals, slow_clients: usize) -> Option<String> {
    let refused = totals.guarded_refused;
    (refused > 0).then(|| {
        format!(
            "slots: {refused} keyed requests were refused for want of a slot, beside {slow_clients} slow keyless clients"
        )
    })
}

impl Soak {
    /// `n` slow clients, spread over the gateways, until `stop`.
    pub(super) fn spawn_slow_clients(
        self: &Arc<Self>,
        n: usize,
        stop: &Arc<AtomicBool>,
    ) -> tokio::task::JoinSet<()> {
        let mut clients = tokio::task::JoinSet::new();
        for i in 0..n {
            let (soak, stop) = (self.clone(), stop.clone());
            clients.spawn(async move {
                let gateway = &soak.gateways[i % soak.gateways.len()];
                while !stop.load(Ordering::Relaxed) {
                    soak.slow_request(gateway).await;
                }
            });
        }
        clients
    }

    async fn slow_request(&self, gateway: &Gateway) {
        let t = &self.slow;
        bump(&t.sent);
        let status = tokio::time::timeout(ANSWER_WITHIN, slow_post(gateway))
            .await
            .ok()
            .flatten();
        match status {
            Some(408) => bump(&t.cut),
            Some(503) => {
                bump(&t.shed);
                // Refused at once: a breath before the next try, not a spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(_) => bump(&t.other),
            None => {
                bump(&t.broken);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One slow keyless POST; the answer's status, if one came.
async fn slow_post(gateway: &Gateway) -> Option<u16> {
    let mut stream = TcpStream::connect(gateway.proxy).await.ok()?;
    let head = "POST /orders HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n{\"order\":\"slow";
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    let line = answer.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}
