//! `POST /fulfilments`: a three-step order — reserve stock, charge, ship —
//! run once per order id under the ledger's own guard, with a recovery point
//! after each step.
//!
//! Each step applies its effect to the books (written to the books file, if
//! any, before the step counts as done), then records a checkpoint. A
//! holder killed between steps is taken over after its lease by the next
//! request for the order, which gets the last checkpoint and continues with
//! the step after it: each step is applied once (`Books::steps` counts
//! them). Killed after a step's effect but before its checkpoint, that one
//! step runs again; that is the window a recovery point cannot close.
//!
//! Request: `{"order": str, "sku": str, "qty": int, "cents": int,
//! "step_ms": int?}` (`step_ms`, at most 60000, is a pause before each step
//! after the first: time to kill the holder in). The idempotency key is
//! `fulfil/{order}`; the fingerprint is the canonical one of `wit/guard.wit`
//! over `POST /fulfilments` and the body. Answers: 201 with the
//! fulfilment (`resumed_from` names the checkpoint a takeover continued
//! from, or is null), the same bytes again for a repeat
//! (`idempotent-replayed: true`), 409 while another request for the order
//! runs (`Retry-After`), 422 for the order id with another body, 409
//! `OUT_OF_STOCK` (stored: a repeat gets it too), 400 for a bad order, 503
//! when the store fails (nothing ran) or the ledger has no guard; the
//! refusals are the gateway's `application/problem+json` ([`Problem`]).

use super::{Books, Ledger};
use crate::server::gate::to_http;
use crate::server::{Problem, Profile};
use crate::{Outcome, Progress, RequestParts, Response, RunError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderValue;
use serde::Deserialize;
use std::time::Duration;

/// One fulfilment as clients send it.
#[derive(Clone, Debug, Deserialize)]
pub struct Fulfilment {
    pub order: String,
    #[expect(
        dead_code,
        reason = "what clients send, as for an order; the ledger keeps one stock for every SKU"
    )]
    pub sku: String,
    pub qty: i64,
    pub cents: i64,
    /// A pause before the charge and before the shipping, in milliseconds.
    #[serde(default)]
    pub step_ms: u64,
}

/// The steps, in order, and the checkpoint each one records.
const STEPS: [(&str, &str); 3] = [
    ("reserve", "reserved"),
    ("charge", "charged"),
    ("ship", "shipped"),
];

pub(super) async fn fulfil(State(ledger): State<Ledger>, body: Bytes) -> axum::response::Response {
    let bad = |why: String| Problem::BadRequest(why).into_response(Profile::Ietf);
    let order: Fulfilment = match serde_json::from_slice(&body) {
        Ok(order) => order,
        Err(e) => {
            return bad(format!(
                "expected JSON {{\"order\":str,\"sku\":str,\"qty\":int,\"cents\":int,\"step_ms\":int?}}: {e}"
            ));
        }
    };
    if order.qty < 1 || order.cents < 0 || order.order.is_empty() || order.step_ms > 60_000 {
        return bad(
            "qty must be at least 1, cents at least 0, order non-empty, step_ms at most 60000"
                .into(),
        );
    }
    let Some(guard) = ledger.guard.clone() else {
        return Problem::StoreUnavailable("this ledger has no guard".into())
            .into_response(Profile::Ietf);
    };
    let fingerprint = RequestParts {
        method: "POST".into(),
        path: "/fulfilments".into(),
        headers: vec![],
        body: body.to_vec(),
    }
    .fingerprint();
    let key = format!("fulfil/{}", order.order);
    let outcome = guard
        .run_resumable(&key, &fingerprint, |progress| {
            steps(&ledger, &order, progress)
        })
        .await;
    let problem = match outcome {
        Ok(Outcome::Executed(r)) | Err(RunError::NotRecorded { response: r, .. }) => {
            return to_http(&r);
        }
        Ok(Outcome::Replayed(r)) => {
            let mut response = to_http(&r);
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            return response;
        }
        Ok(Outcome::InFlight { retry_after }) => Problem::InFlight { retry_after },
        Ok(Outcome::Conflict) => Problem::KeyMismatch,
        Ok(Outcome::Unavailable(why)) | Err(RunError::Handler(why)) => {
            Problem::StoreUnavailable(why)
        }
        Err(RunError::InvalidInput(why)) => Problem::BadRequest(why),
    };
    problem.into_response(Profile::Ietf)
}

/// The three steps, from the one after `progress`'s checkpoint.
async fn steps(
    ledger: &Ledger,
    order: &Fulfilment,
    progress: Progress,
) -> Result<Response, String> {
    let resumed = progress.resumed().cloned();
    let done = resumed
        .as_ref()
        .and_then(|c| STEPS.iter().position(|(_, phase)| *phase == c.phase))
        .map_or(0, |i| i + 1);
    // What each step produced: its id, kept in the checkpoints.
    let mut ids: Vec<String> = match &resumed {
        Some(c) => serde_json::from_slice(&c.data).map_err(|e| format!("checkpoint data: {e}"))?,
        None => Vec::new(),
    };
    for (i, (step, phase)) in STEPS.iter().enumerate().skip(done) {
        if i > 0 && order.step_ms > 0 {
            tokio::time::sleep(Duration::from_millis(order.step_ms)).await;
        }
        match apply(ledger, order, step, progress.fence().0)? {
            Applied::Id(id) => ids.push(id),
            Applied::OutOfStock => {
                return Ok(json_response(
                    409,
                    &serde_json::json!({"error": "OUT_OF_STOCK", "order": order.order}),
                ));
            }
        }
        if i + 1 < STEPS.len() {
            let data = serde_json::to_vec(&ids).map_err(|e| e.to_string())?;
            progress
                .checkpoint(*phase, data)
                .await
                .map_err(|e| format!("checkpoint {phase}: {e}"))?;
        }
    }
    let [reservation, charge, shipment] = <[String; 3]>::try_from(ids)
        .map_err(|ids| format!("expected three step ids, have {ids:?}"))?;
    Ok(json_response(
        201,
        &serde_json::json!({
            "order": order.order,
            "status": "shipped",
            "reservation": reservation,
            "charge": charge,
            "shipment": shipment,
            "resumed_from": resumed.map(|c| c.phase),
        }),
    ))
}

enum Applied {
    Id(String),
    OutOfStock,
}

/// Applies one step to the books and saves them.
fn apply(ledger: &Ledger, order: &Fulfilment, step: &str, fence: u64) -> Result<Applied, String> {
    let mut books = ledger.lock();
    let id = format!("{step}-{}-{fence}", order.order);
    match step {
        "reserve" => {
            if books.stock < order.qty {
                return Ok(Applied::OutOfStock);
            }
            books.stock -= order.qty;
            *books.reservations.entry(order.order.clone()).or_default() += order.qty;
        }
        "charge" => {
            *books.charges.entry(order.order.clone()).or_default() += order.cents;
        }
        _ => {
            *books.shipped.entry(order.order.clone()).or_default() += order.qty;
        }
    }
    count(&mut books, &order.order, step);
    ledger
        .save(&books)
        .map_err(|e| format!("save the books: {e}"))?;
    Ok(Applied::Id(id))
}

fn count(books: &mut Books, order: &str, step: &str) {
    *books
        .steps
        .entry(order.to_owned())
        .or_default()
        .entry(step.to_owned())
        .or_default() += 1;
}

fn json_response(status: u16, body: &serde_json::Value) -> Response {
    Response {
        status,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: body.to_string().into_bytes(),
    }
}
