//! The soak's verdict: the ledger's books, the stored responses and what
//! the clients saw, checked against each other. Pure, so its unit tests
//! feed it broken books.

use idem::testing::{Books, Run};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};

/// What one order's clients did and saw: the input of [`check`].
#[derive(Clone, Debug, Default)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one order
pub struct OrderLog {
    pub id: String,
    pub qty: i64,
    pub cents: i64,
    /// Every 2xx body a client got for this key, first answers and replays.
    pub bodies: Vec<Seen>,
    /// The status of the last final answer (anything but 409, 5xx or no
    /// answer) to the order's own body; `None`: no client ever got one.
    pub status: Option<u16>,
    /// The key sent again with another body, and what came of it.
    pub reuse: Reuse,
    /// A request of the order was at a gateway when it was killed.
    pub at_kill: bool,
    /// A request of the order overlapped a store fault that fails an
    /// operation or loses its reply, or a latency spike on `replace`.
    pub under_fault: bool,
    /// A request of the order was at a gateway while it was stopped.
    pub at_pause: bool,
    /// A request of the order took longer than the upstream timeout, timed
    /// out at the client, or got a 5xx from the upstream (the gateway then
    /// releases the key for a retry, by design).
    pub slow: bool,
}

/// One 2xx answer a client got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub body: Vec<u8>,
    /// It came with `Idempotent-Replayed`: from the store.
    pub replayed: bool,
}

/// Whether an order's key was sent again with another body, and its final answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reuse {
    #[default]
    NotSent,
    Answered(u16),
    /// Sent, but no final answer came.
    Unanswered,
}

/// A key's record as the admin API shows it at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// No live record.
    Missing,
    /// Still claimed: its response was never recorded.
    Processing,
    /// Completed with this response.
    Done { status: u16, body: Vec<u8> },
    /// The admin API could not say.
    Unreadable(String),
}

/// The verdict on one soak.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// Orders whose handler ran more than once, and why.
    pub reexecuted: usize,
    pub reexecuted_at_kill: usize,
    pub reexecuted_under_fault: usize,
    pub reexecuted_slow: usize,
    pub reexecuted_paused: usize,
    /// 2xx answers checked against their key's kept response.
    pub answers_checked: usize,
    /// Pairs of runs of one key that overlapped in time.
    pub overlapping_runs: usize,
    /// Stored responses that match the ledger.
    pub stored_matching: usize,
    /// Keys still claimed at the end (a response a fault kept from being recorded).
    pub left_processing: usize,
}

/// Checks what the ledger did, what the store holds and what clients saw
/// against each other. `stored[i]` is the record of `orders[i]`'s key.
#[allow(clippy::too_many_lines)] // one check after another, each with its message
pub fn check(orders: &[OrderLog], books: &Books, stock_at_start: i64, stored: &[Stored]) -> Report {
    let mut report = Report::default();
    let mut v = Vec::new();
    let known: HashSet<&str> = orders.iter().map(|o| o.id.as_str()).collect();
    let in_ledger: BTreeSet<&String> = books
        .executions
        .keys()
        .chain(books.reservations.keys())
        .chain(books.charges.keys())
        .collect();
    for id in in_ledger {
        if !known.contains(id.as_str()) {
            v.push(format!("the ledger has order {id}, which no client sent"));
        }
    }
    let reserved: i64 = books.reservations.values().sum();
    if books.stock + reserved != stock_at_start {
        v.push(format!(
            "stock is not conserved: {} left + {reserved} reserved is not the {stock_at_start} at the start",
            books.stock
        ));
    }

    for (order, stored) in orders.iter().zip(stored) {
        let id = order.id.as_str();
        let charge = books.charges.get(id).copied();
        match (books.reservations.get(id), charge) {
            (Some(&qty), Some(cents)) if qty != order.qty || cents != order.cents => {
                v.push(format!(
                    "order {id}: reserved {qty} and charged {cents} cents, but the order was {} for {} cents",
                    order.qty, order.cents
                ));
            }
            (Some(_), None) | (None, Some(_)) => v.push(format!(
                "order {id}: a reservation without a charge, or a charge without a reservation"
            )),
            _ => {}
        }

        match order.status {
            None => v.push(format!("order {id}: no client ever got a final answer")),
            Some(status) if !(200..300).contains(&status) => v.push(format!(
                "order {id}: its final answer was {status}, not 2xx"
            )),
            Some(_) => {}
        }
        if !order.bodies.is_empty() && charge.is_none() {
            v.push(format!(
                "order {id}: a client got a 2xx, but the ledger has no charge"
            ));
        }
        for seen in &order.bodies {
            let (body_order, cents) =
                ledger_body(&seen.body).unwrap_or_else(|| ("<unreadable>".to_owned(), -1));
            if body_order != id {
                v.push(format!(
                    "order {id}: a client got the body of order {body_order}"
                ));
            } else if Some(cents) != charge {
                v.push(format!(
                    "order {id}: a client got a body with {cents} cents; the ledger charged {charge:?}"
                ));
            }
        }
        match order.reuse {
            Reuse::NotSent | Reuse::Answered(422) => {}
            Reuse::Answered(status) => v.push(format!(
                "order {id}: its key, reused with another body, got {status}, not 422"
            )),
            Reuse::Unanswered => v.push(format!(
                "order {id}: its key, reused with another body, never got a final answer"
            )),
        }

        match stored {
            Stored::Done { status, body } => match ledger_body(body) {
                Some((body_order, cents))
                    if (200..300).contains(status)
                        && body_order == id
                        && Some(cents) == charge =>
                {
                    report.stored_matching += 1;
                }
                _ => v.push(format!(
                    "order {id}: the stored response ({status}, {:?}) does not match the ledger's charge {charge:?}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                )),
            },
            Stored::Processing => report.left_processing += 1,
            Stored::Missing if charge.is_some() => v.push(format!(
                "order {id}: charged, but the store has no record of its key"
            )),
            Stored::Missing => {}
            Stored::Unreadable(why) => {
                v.push(format!("order {id}: its record could not be read: {why}"));
            }
        }

        let runs = books.executions.get(id).copied().unwrap_or(0);
        let fences = books.fences.get(id).map_or(&[][..], Vec::as_slice);
        if fences.len() as u64 != runs {
            v.push(format!(
                "order {id}: ran {runs} times, {} of them through the gateway with a fence",
                fences.len()
            ));
        }
        let distinct: BTreeSet<u64> = fences.iter().copied().collect();
        if distinct.len() != fences.len() {
            v.push(format!(
                "order {id}: two runs under one claim (fences {fences:?})"
            ));
        }
        let timed = books.runs.get(id).map_or(&[][..], Vec::as_slice);
        if !books.runs.is_empty() && timed.len() as u64 != runs {
            v.push(format!(
                "order {id}: ran {runs} times, {} of them with their times recorded",
                timed.len()
            ));
        }
        let kept = match stored {
            Stored::Done { status, body } if (200..300).contains(status) => Some(body.as_slice()),
            _ => None,
        };
        check_bodies(order, kept, &mut report, &mut v);
        check_overlaps(order, kept, timed, &mut report, &mut v);
        if runs > 1 {
            report.reexecuted += 1;
            if order.at_kill {
                report.reexecuted_at_kill += 1;
            } else if order.under_fault {
                report.reexecuted_under_fault += 1;
            } else if order.at_pause {
                report.reexecuted_paused += 1;
            } else if order.slow {
                report.reexecuted_slow += 1;
            } else {
                v.push(format!(
                    "order {id}: ran {runs} times (fences {fences:?}) with no kill, store fault, pause or slow request to explain it"
                ));
            }
        }
    }
    report.violations = v;
    report
}

/// No key gives two different 2xx bodies: every 2xx body a client saw, first
/// answer or replay, is the key's `kept` response, byte for byte. A replay
/// comes from the store, so it must be; a first answer is sent only once its
/// response is recorded (a gateway that cannot record it answers 503
/// `response-not-recorded` instead), so it must be too, whatever faults,
/// kills or pauses its request met.
fn check_bodies(order: &OrderLog, kept: Option<&[u8]>, report: &mut Report, v: &mut Vec<String>) {
    let id = &order.id;
    let kept_execution = kept.and_then(execution);
    for seen in &order.bodies {
        report.answers_checked += 1;
        if Some(seen.body.as_slice()) == kept {
            continue;
        }
        let got = execution(&seen.body);
        let what = if seen.replayed {
            "a replay"
        } else {
            "a first answer"
        };
        v.push(format!(
            "order {id}: two different 2xx bodies: {what} gave the body of execution {got:?}, the key kept execution {kept_execution:?}"
        ));
    }
}

/// Two runs of one key overlap in time only as a takeover: the later under
/// a higher fence, and the earlier's completion refused, so neither the kept
/// response nor any replay is the earlier run's.
fn check_overlaps(
    order: &OrderLog,
    kept: Option<&[u8]>,
    runs: &[Run],
    report: &mut Report,
    v: &mut Vec<String>,
) {
    let id = &order.id;
    let answered: BTreeSet<u64> = kept
        .into_iter()
        .chain(
            order
                .bodies
                .iter()
                .filter(|s| s.replayed)
                .map(|s| &s.body[..]),
        )
        .filter_map(execution)
        .collect();
    let mut runs: Vec<&Run> = runs.iter().collect();
    runs.sort_by_key(|r| (r.started_ms, r.ended_ms));
    for (i, earlier) in runs.iter().enumerate() {
        for later in runs[i + 1..]
            .iter()
            .filter(|later| later.started_ms < earlier.ended_ms)
        {
            report.overlapping_runs += 1;
            let overlap = format!(
                "two runs overlapped: execution {} (fence {:?}) ran {} ms, execution {} (fence {:?}) started {} ms into it",
                earlier.execution,
                earlier.fence,
                earlier.ended_ms - earlier.started_ms,
                later.execution,
                later.fence,
                later.started_ms - earlier.started_ms,
            );
            if !matches!((earlier.fence, later.fence), (Some(a), Some(b)) if b > a) {
                v.push(format!(
                    "order {id}: {overlap}, and the later has no higher fence"
                ));
            } else if answered.contains(&earlier.execution) {
                v.push(format!(
                    "order {id}: {overlap}, and the earlier's response was kept or replayed"
                ));
            }
        }
    }
}

/// The `execution` of a ledger response body: which run of the order made it.
fn execution(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("execution")?
        .as_u64()
}

/// The `order` and `cents` of a ledger response body.
fn ledger_body(body: &[u8]) -> Option<(String, i64)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    Some((
        value.get("order")?.as_str()?.to_owned(),
        value.get("cents")?.as_i64()?,
    ))
}

#[cfg(test)]
mod tests;
