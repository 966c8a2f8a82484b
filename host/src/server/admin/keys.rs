//! The keys: list (search, filter, sort, page), read, release, expire, delete.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Admin {
    pub(super) fn now_ms(&self) -> u64 {
        self.gateway.guard().clock().now_ms()
    }

    pub(super) fn key_info(&self, key: &str, entry: &Entry, now_ms: u64) -> api::KeyInfo {
        let r = &entry.record;
        let processing = r.state == KeyState::Processing;
        api::KeyInfo {
            key: key.to_owned(),
            state: if processing {
                api::KeyState::Processing
            } else {
                api::KeyState::Done
            },
            // A done record was written by `complete` at the claim's fence + 1.
            fence: if processing {
                entry.version
            } else {
                entry.version.saturating_sub(1)
            },
            version: entry.version,
            lease_until_ms: r.lease_until_ms,
            lease_remaining_ms: if processing {
                r.lease_until_ms.saturating_sub(now_ms)
            } else {
                0
            },
            expires_at_ms: r.expires_at_ms,
            expires_in_ms: r.expires_at_ms.saturating_sub(now_ms),
            fingerprint: r.fingerprint.clone(),
            status: r.response.as_ref().map(|resp| resp.status),
            replays: self.gateway.observer().replays(key),
            holder: if r.holder == 0 {
                String::new()
            } else {
                format!("{:016x}", r.holder)
            },
            held_here: processing && self.gateway.observer().runs(key, r.holder),
        }
    }
}

pub(super) async fn list_keys(
    State(admin): State<Admin>,
    params: Result<Query<api::KeyListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let asked = match params.check() {
        Ok(query) => query,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let state = asked.state.map(|state| match state {
        api::KeyState::Processing => KeyState::Processing,
        api::KeyState::Done => KeyState::Done,
    });
    let limit = asked.limit as usize;
    let descending = asked.order == api::Order::Desc;
    let now = admin.now_ms();
    let store = admin.gateway.guard().store();
    let prefix = asked.prefix;
    let search = Some(asked.search).filter(|s| !s.is_empty());

    if asked.sort == api::Sort::Key && !descending && search.is_none() {
        // Key order is the store's own: page with its cursor.
        let query = ListQuery {
            prefix,
            state,
            after: asked.after,
            limit: limit + 1,
        };
        let mut rows = match store.list(&query, now).await {
            Ok(rows) => rows,
            Err(e) => return unavailable(&e),
        };
        let next = (rows.len() > limit).then(|| {
            rows.truncate(limit);
            rows.last().map(|(k, _)| k.clone())
        });
        return json(&api::KeyPage {
            now_ms: now,
            keys: rows
                .iter()
                .map(|(k, e)| admin.key_info(k, e, now))
                .collect(),
            next: next.flatten(),
            total: None,
        });
    }

    // Other orders: sort a bounded scan; the cursor is an offset.
    let offset = match asked.after.as_deref().map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "after must be the `next` value of the previous page",
            );
        }
    };
    let query = ListQuery {
        prefix,
        state,
        after: None,
        limit: MAX_SORT_SCAN,
    };
    let rows = match &search {
        None => store.list(&query, now).await,
        Some(search) => scan_matching(store.as_ref(), query, search, now).await,
    };
    let mut rows = match rows {
        Ok(rows) => rows,
        Err(e) => return unavailable(&e),
    };
    let observer = admin.gateway.observer();
    match asked.sort {
        api::Sort::Expires => rows.sort_by_key(|(k, e)| (e.record.expires_at_ms, k.clone())),
        api::Sort::Lease => rows.sort_by_key(|(k, e)| (e.record.lease_until_ms, k.clone())),
        api::Sort::Replays => rows.sort_by_cached_key(|(k, _)| (observer.replays(k), k.clone())),
        api::Sort::Key => {}
    }
    if descending {
        rows.reverse();
    }
    let total = rows.len();
    json(&api::KeyPage {
        now_ms: now,
        keys: rows
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(k, e)| admin.key_info(k, e, now))
            .collect(),
        next: (offset + limit < total).then(|| (offset + limit).to_string()),
        total: Some(total as u64),
    })
}

/// The records of `query` whose client key contains `search` (ASCII case
/// ignored), in key order: at most [`MAX_SORT_SCAN`] of them, from at most
/// [`MAX_SEARCH_SCAN`] records read.
pub(super) async fn scan_matching(
    store: &dyn crate::store::Store,
    mut query: ListQuery,
    search: &str,
    now: u64,
) -> Result<Vec<(String, Entry)>, crate::store::StoreError> {
    let needle = search.to_ascii_lowercase();
    let matches = |key: &str| {
        let own = key.split_once('/').map_or(key, |(_, own)| own);
        own.to_ascii_lowercase().contains(&needle)
    };
    let mut found = Vec::new();
    let mut read = 0;
    loop {
        let batch = store.list(&query, now).await?;
        read += batch.len();
        let last = (batch.len() == query.limit).then(|| batch.last().map(|(k, _)| k.clone()));
        found.extend(batch.into_iter().filter(|(k, _)| matches(k)));
        match last.flatten() {
            Some(after) if found.len() < MAX_SORT_SCAN && read < MAX_SEARCH_SCAN => {
                query.after = Some(after);
            }
            _ => break,
        }
    }
    found.truncate(MAX_SORT_SCAN);
    Ok(found)
}

pub(super) async fn get_key(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    let now = admin.now_ms();
    match admin.gateway.guard().store().get(&key, now).await {
        Ok(Some(entry)) => json(&api::KeyDetail {
            info: admin.key_info(&key, &entry, now),
            response: entry.record.response.as_ref().map(|r| api::StoredResponse {
                status: r.status,
                headers: r
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
                body_bytes: r.body.len() as u64,
                body_preview: String::from_utf8_lossy(&r.body)
                    .chars()
                    .take(BODY_PREVIEW_CHARS)
                    .collect(),
                body_base64: base64::engine::general_purpose::STANDARD.encode(&r.body),
            }),
        }),
        Ok(None) => no_key(&key),
        Err(e) => unavailable(&e),
    }
}

pub(super) fn no_key(key: &str) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        format!("no live record for key {key:?}"),
    )
}

/// `GET /v1/keys/{key}/history`: what this gateway saw happen to the key
/// (a key it never saw has an empty history, not a 404: another gateway may
/// have served it).
pub(super) async fn key_history(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    json(&admin.gateway.observer().history(&key))
}

pub(super) async fn delete_key(
    State(admin): State<Admin>,
    Caller(by): Caller,
    Path(key): Path<String>,
) -> Response {
    // The record as it was, for the audit trail (a delete answers nothing else).
    let store = admin.gateway.guard().store();
    let now = admin.now_ms();
    let before = match store.get(&key, now).await {
        Ok(Some(entry)) => Some(entry),
        Ok(None) => return refused(&by, AdminAction::Delete, &key, no_key(&key)),
        Err(e) => return refused(&by, AdminAction::Delete, &key, unavailable(&e)),
    };
    match store.delete(&key, None, now).await {
        Ok(true) => {
            let observer = admin.gateway.observer();
            observer.forget_replays(&key);
            let (fence, version) = before.map_or((0, 0), |e| {
                (admin.key_info(&key, &e, admin.now_ms()).fence, e.version)
            });
            observer.admin_action(AdminAction::Delete, &key, &by, fence, version);
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => refused(&by, AdminAction::Delete, &key, no_key(&key)),
        Err(e) => refused(&by, AdminAction::Delete, &key, unavailable(&e)),
    }
}

/// An operator's action that changed nothing, logged with why.
pub(super) fn refused(by: &str, action: AdminAction, key: &str, response: Response) -> Response {
    tracing::info!(
        target: "idem::admin",
        action = action.as_str(),
        key,
        by,
        status = response.status().as_u16(),
        "operator's action refused"
    );
    response
}

#[allow(clippy::result_large_err)] // the error is the response itself
pub(super) async fn release_key(
    State(admin): State<Admin>,
    Caller(by): Caller,
    Path(key): Path<String>,
) -> Response {
    rewrite(&admin, &by, AdminAction::Release, &key, |record, now| {
        if record.state != KeyState::Processing {
            return Err(problem(
                StatusCode::CONFLICT,
                format!("key {key:?} is {}, not processing", record.state.as_str()),
            ));
        }
        record.lease_until_ms = now;
        Ok(())
    })
    .await
}

#[allow(clippy::result_large_err)]
pub(super) async fn expire_key(
    State(admin): State<Admin>,
    Caller(by): Caller,
    Path(key): Path<String>,
) -> Response {
    rewrite(&admin, &by, AdminAction::Expire, &key, |record, now| {
        record.expires_at_ms = now;
        record.lease_until_ms = record.lease_until_ms.min(now);
        Ok(())
    })
    .await
}

/// Reads a key's record, changes it, and writes it back only if no one
/// wrote in between (version check), so an operator never clobbers a
/// request that is completing. The change, made `by` the caller, goes on
/// the audit trail; a refusal is logged.
pub(super) async fn rewrite(
    admin: &Admin,
    by: &str,
    action: AdminAction,
    key: &str,
    change: impl FnOnce(&mut crate::Record, u64) -> Result<(), Response>,
) -> Response {
    let store = admin.gateway.guard().store();
    let now = admin.now_ms();
    let entry = match store.get(key, now).await {
        Ok(Some(entry)) => entry,
        Ok(None) => return refused(by, action, key, no_key(key)),
        Err(e) => return refused(by, action, key, unavailable(&e)),
    };
    let mut record = entry.record.clone();
    if let Err(response) = change(&mut record, now) {
        return refused(by, action, key, response);
    }
    match store.replace(key, entry.version, record.clone(), now).await {
        Ok(true) => {
            let fence = admin.key_info(key, &entry, now).fence;
            admin
                .gateway
                .observer()
                .admin_action(action, key, by, fence, entry.version);
            let version = entry.version + 1;
            json(&admin.key_info(key, &Entry { record, version }, now))
        }
        Ok(false) => refused(
            by,
            action,
            key,
            problem(
                StatusCode::CONFLICT,
                format!("key {key:?} changed while it was being rewritten; try again"),
            ),
        ),
        Err(e) => refused(by, action, key, unavailable(&e)),
    }
}
