//! `/v1/keys`: the list query, its pages, one key's detail.

use serde::{Deserialize, Serialize};

/// How many keys a page holds when the query does not say.
pub const DEFAULT_LIMIT: u32 = 100;
/// The most keys one page may hold.
pub const MAX_LIMIT: u32 = 1000;

/// A key's state as the store records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    Processing,
    Done,
}

impl KeyState {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Processing => "processing",
            KeyState::Done => "done",
        }
    }
}

/// One row of `GET /v1/keys`, and the answer to `POST /v1/keys/{key}/release`
/// and `/expire`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub key: String,
    pub state: KeyState,
    /// The fence of the claim that wrote the record (a done record was
    /// written by `complete` at the claim's fence + 1).
    pub fence: u64,
    pub version: u64,
    pub lease_until_ms: u64,
    /// 0 once done.
    pub lease_remaining_ms: u64,
    pub expires_at_ms: u64,
    pub expires_in_ms: u64,
    pub fingerprint: String,
    /// The stored response's status, once done.
    pub status: Option<u16>,
    /// Times the gateway replayed the key's response.
    pub replays: u64,
    /// The holder id of the claim that wrote the record, as 16 hex digits
    /// (`""` for a record a 0.1 host wrote, without one). Each claim draws
    /// its own: two claims of one key never share it.
    #[serde(default)]
    pub holder: String,
    /// Whether that claim is one this gateway is running right now (its
    /// request is inside this gateway); `false` for a claim another gateway
    /// runs, or one whose holder is gone (crashed, or the lease lapsed).
    #[serde(default)]
    pub held_here: bool,
}

/// `GET /v1/keys`: one page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPage {
    pub now_ms: u64,
    pub keys: Vec<KeyInfo>,
    /// The `after` of the next page; `None` on the last.
    pub next: Option<String>,
    /// Matching keys in all, when the page comes from a sorted scan
    /// (`None` in key order, which pages with the store's own cursor).
    pub total: Option<u64>,
}

/// The stored response of a completed key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    /// Name and value, the value decoded as UTF-8 (lossy).
    pub headers: Vec<(String, String)>,
    pub body_bytes: u64,
    /// The first 1,024 characters of the body, decoded as UTF-8 (lossy).
    pub body_preview: String,
    #[serde(default)]
    pub body_base64: String,
}

/// `GET /v1/keys/{key}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDetail {
    #[serde(flatten)]
    pub info: KeyInfo,
    pub response: Option<StoredResponse>,
}

/// The orders `GET /v1/keys` can sort by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sort {
    Key,
    Lease,
    Expires,
    Replays,
}

impl Sort {
    pub const ALL: [Sort; 4] = [Sort::Key, Sort::Lease, Sort::Expires, Sort::Replays];

    pub fn as_str(self) -> &'static str {
        match self {
            Sort::Key => "key",
            Sort::Lease => "lease",
            Sort::Expires => "expires",
            Sort::Replays => "replays",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    Asc,
    Desc,
}

impl Order {
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Asc => "asc",
            Order::Desc => "desc",
        }
    }
}

/// `GET /v1/keys`'s query string as it travels: every parameter optional
/// and still text, so that a bad value gets its own message from
/// [`KeyListParams::check`]. A query string leaves an absent one out
/// (`serde_urlencoded` writes no pair for `None`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyListParams {
    /// `processing` or `done`.
    pub state: Option<String>,
    pub prefix: Option<String>,
    /// Matches anywhere in the client's own key (after the client scope
    /// and its `/`), ignoring ASCII case.
    pub search: Option<String>,
    /// The previous page's `next`.
    pub after: Option<String>,
    /// 1 to [`MAX_LIMIT`]; [`DEFAULT_LIMIT`] when absent.
    pub limit: Option<u32>,
    /// `key`, `expires`, `lease` or `replays`.
    pub sort: Option<String>,
    /// `asc` or `desc`.
    pub order: Option<String>,
}

/// A checked `GET /v1/keys` query: what the console asks for and what the
/// gateway answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyQuery {
    pub state: Option<KeyState>,
    pub prefix: String,
    /// Empty: no search.
    pub search: String,
    pub sort: Sort,
    pub order: Order,
    pub after: Option<String>,
    pub limit: u32,
}

impl Default for KeyQuery {
    fn default() -> Self {
        KeyQuery {
            state: None,
            prefix: String::new(),
            search: String::new(),
            sort: Sort::Key,
            order: Order::Asc,
            after: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

impl KeyQuery {
    /// The query string that asks for it: empty prefix and search left out.
    pub fn params(&self) -> KeyListParams {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        KeyListParams {
            state: self.state.map(|s| s.as_str().to_owned()),
            prefix: non_empty(&self.prefix),
            search: non_empty(&self.search),
            after: self.after.clone(),
            limit: Some(self.limit),
            sort: Some(self.sort.as_str().to_owned()),
            order: Some(self.order.as_str().to_owned()),
        }
    }
}

impl KeyListParams {
    /// The query these parameters ask for, or why they are refused (the
    /// `detail` of the 400 answer).
    pub fn check(self) -> Result<KeyQuery, String> {
        let state = match self.state.as_deref() {
            None => None,
            Some("processing") => Some(KeyState::Processing),
            Some("done") => Some(KeyState::Done),
            Some(s) => return Err(format!("state {s:?} is not processing or done")),
        };
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(format!("limit {limit} is outside 1 to {MAX_LIMIT}"));
        }
        let sort = match self.sort.as_deref() {
            None => Sort::Key,
            Some(s) => Sort::ALL
                .into_iter()
                .find(|sort| sort.as_str() == s)
                .ok_or_else(|| format!("sort {s:?} is not key, expires, lease or replays"))?,
        };
        let order = match self.order.as_deref() {
            None | Some("asc") => Order::Asc,
            Some("desc") => Order::Desc,
            Some(o) => return Err(format!("order {o:?} is not asc or desc")),
        };
        Ok(KeyQuery {
            state,
            prefix: self.prefix.unwrap_or_default(),
            search: self.search.unwrap_or_default(),
            sort,
            order,
            after: self.after,
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_survives_its_query_string() {
        let query = KeyQuery {
            state: Some(KeyState::Done),
            prefix: "tenant/".into(),
            search: String::new(),
            sort: Sort::Replays,
            order: Order::Desc,
            after: Some("200".into()),
            limit: 50,
        };
        assert_eq!(query.params().check(), Ok(query));
        assert_eq!(KeyListParams::default().check(), Ok(KeyQuery::default()));
    }

    #[test]
    fn bad_parameters_name_the_problem() {
        let bad = |params: KeyListParams| params.check().unwrap_err();
        let state = bad(KeyListParams {
            state: Some("finished".into()),
            ..KeyListParams::default()
        });
        assert_eq!(state, "state \"finished\" is not processing or done");
        let limit = bad(KeyListParams {
            limit: Some(0),
            ..KeyListParams::default()
        });
        assert_eq!(limit, "limit 0 is outside 1 to 1000");
        let sort = bad(KeyListParams {
            sort: Some("age".into()),
            ..KeyListParams::default()
        });
        assert_eq!(sort, "sort \"age\" is not key, expires, lease or replays");
        let order = bad(KeyListParams {
            order: Some("up".into()),
            ..KeyListParams::default()
        });
        assert_eq!(order, "order \"up\" is not asc or desc");
    }
}
