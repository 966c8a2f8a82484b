//! What walks the keys under the prefix: `list` for operators, and the
//! purge of records Redis still holds past their expiry.

use super::connect::{Conn, Failed};
use super::resp::{Command, Reply};
use super::scripts::PURGE;
use super::value::decode;
use super::{NAME, RedisStore, value_or_nil};
use crate::store::codec::{corrupt, unavailable};
use crate::store::{Entry, ListQuery, Result};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

/// Keys asked of one `SCAN` page, and sent to one purge script, by a purge.
const PURGE_PAGE: usize = 500;

/// Where a purge of a Redis store goes on from.
#[derive(Default)]
pub(super) struct PurgeCursor {
    /// The node being scanned: its index in [`RedisStore::scan_nodes`]'s
    /// list and its address (`None`: the lone server), to notice a cluster
    /// whose primaries changed since.
    node: usize,
    addr: Option<(String, u16)>,
    /// Its `SCAN` cursor (0: from the start).
    cursor: u64,
    /// Keys of the last page not yet sent to the purge script.
    pending: Vec<Vec<u8>>,
}

/// At most this many keys under a prefix are scanned by `list`, an operator's
/// tool: past it the answer would cost the server too much to compute.
pub const LIST_SCAN_MAX: usize = 1_000_000;

impl RedisStore {
    /// Scans the keys under the prefix (up to [`LIST_SCAN_MAX`]; on a
    /// cluster, on each primary), sorts them and reads the page: an
    /// operator's tool, O(keys under the prefix).
    pub(super) async fn scan_list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>> {
        let pattern = glob_prefix(&self.full_key(&query.prefix));
        let mut keys: Vec<String> = Vec::new();
        for node in self.scan_nodes().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = self
                    .scan_page(node.as_ref(), cursor, &pattern, 1000)
                    .await?;
                for raw in batch {
                    let full = String::from_utf8(raw).map_err(|e| {
                        corrupt(
                            NAME,
                            &String::from_utf8_lossy(e.as_bytes()),
                            "the key is not UTF-8",
                        )
                    })?;
                    let key = full[self.prefix.len()..].to_owned();
                    if query
                        .after
                        .as_ref()
                        .is_none_or(|a| key.as_str() > a.as_str())
                    {
                        keys.push(key);
                    }
                }
                if keys.len() > LIST_SCAN_MAX {
                    return Err(unavailable(
                        NAME,
                        format!(
                            "more than {LIST_SCAN_MAX} keys start with {:?}; list a narrower prefix",
                            query.prefix
                        ),
                    ));
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        keys.sort_unstable();
        keys.dedup(); // SCAN may return a key twice.
        let mut rows = Vec::new();
        for chunk in keys.chunks(query.limit.clamp(1, 1000)) {
            // One `GET` per key, all sent at once: the connection pipelines
            // them, and on a cluster each goes to its own node.
            let values = futures_util::future::join_all(chunk.iter().map(|key| async move {
                let mut cmd = Command::new("GET");
                cmd.arg(self.full_key(key));
                value_or_nil(self.send(key, &cmd, None, false).await?)
            }))
            .await;
            for (key, value) in chunk.iter().zip(values) {
                if let Some(value) = value?
                    && let entry = decode(key, &value)?
                    && entry.record.is_live(now_ms)
                    && query.state.is_none_or(|s| s == entry.record.state)
                {
                    rows.push((key.clone(), entry));
                    if rows.len() == query.limit {
                        return Ok(rows);
                    }
                }
            }
        }
        Ok(rows)
    }

    /// Deletes up to `limit` records already expired by `now_ms` that Redis
    /// still holds (within their grace period). Redis frees the rest itself.
    ///
    /// The `SCAN` goes on from where the last call stopped, and the keys of
    /// a page past the last call's limit are kept for the next one: purging
    /// `n` records in batches costs one pass over the keyspace, not one per
    /// batch. A call returns fewer than `limit` only after it has itself
    /// scanned a whole pass, from cursor 0 of the first node to the end of
    /// the last.
    pub(super) async fn purge_held(&self, now_ms: u64, limit: usize) -> Result<usize> {
        let pattern = glob_prefix(&self.prefix);
        let nodes = self.scan_nodes().await?;
        let mut at = self.purge.lock().await;
        if nodes.is_empty() {
            return Ok(0);
        }
        if nodes.get(at.node) != Some(&at.addr) {
            // The first call, or the cluster changed under the cursor.
            *at = PurgeCursor {
                addr: nodes[0].clone(),
                ..PurgeCursor::default()
            };
        }
        let mut purged = 0usize;
        let mut pass_began_here = false;
        loop {
            while purged < limit && !at.pending.is_empty() {
                // Chunks the limit cannot cut, so every key sent is looked at.
                let n = (limit - purged).min(at.pending.len()).min(PURGE_PAGE);
                let from = at.pending.len() - n;
                let chunk: Vec<Vec<u8>> = at.pending.drain(from..).collect();
                purged += self.purge_chunk(&chunk, now_ms).await?;
            }
            if purged >= limit {
                return Ok(purged);
            }
            if at.node == 0 && at.cursor == 0 {
                if pass_began_here {
                    return Ok(purged); // a whole pass since this call began
                }
                pass_began_here = true;
            }
            let (next, batch) = self
                .scan_page(nodes[at.node].as_ref(), at.cursor, &pattern, PURGE_PAGE)
                .await?;
            at.pending = batch;
            at.cursor = next;
            if next == 0 {
                // This node is done: on to the next, or back to the first.
                let node = (at.node + 1) % nodes.len();
                at.node = node;
                at.addr.clone_from(&nodes[node]);
            }
        }
    }

    /// Deletes those of `keys` whose records expired by `now_ms`.
    async fn purge_chunk(&self, keys: &[Vec<u8>], now_ms: u64) -> Result<usize> {
        if !self.is_cluster() {
            return self.purge_keys(keys, now_ms, keys.len()).await;
        }
        // Keys of different slots cannot meet in one script: one call per
        // key, all sent at once.
        let counts = futures_util::future::join_all(
            keys.iter()
                .map(|key| self.purge_keys(std::slice::from_ref(key), now_ms, 1)),
        )
        .await;
        counts.into_iter().sum()
    }

    /// Deletes at most `limit` of `keys` whose records expired by `now_ms`.
    async fn purge_keys(&self, keys: &[Vec<u8>], now_ms: u64, limit: usize) -> Result<usize> {
        let size: usize = keys.iter().map(|k| k.len() + 16).sum();
        let mut cmd = Command::with_capacity("EVALSHA", size + 96);
        cmd.arg(PURGE.hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_slice());
        }
        cmd.arg(now_ms).arg(limit);
        let reply = self.send(&self.prefix, &cmd, Some(&PURGE), false).await?;
        Ok(reply
            .number()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0))
    }

    /// The nodes a `SCAN` must visit: the one server (`None`), or each
    /// primary of the cluster, since a cursor is one node's.
    pub(super) async fn scan_nodes(&self) -> Result<Vec<Option<(String, u16)>>> {
        if !self.is_cluster() {
            return Ok(vec![None]);
        }
        let mut cmd = Command::new("CLUSTER");
        cmd.arg("NODES");
        let reply = self.send(&self.prefix, &cmd, None, false).await?;
        let nodes = reply
            .bytes()
            .ok_or_else(|| unavailable(NAME, format!("CLUSTER NODES answered {reply:?}")))?;
        let nodes = String::from_utf8_lossy(nodes);
        Ok(cluster_primaries(&nodes).into_iter().map(Some).collect())
    }

    /// One page of the keys matching `pattern` on `node`.
    async fn scan_page(
        &self,
        node: Option<&(String, u16)>,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> Result<(u64, Vec<Vec<u8>>)> {
        let mut cmd = Command::new("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (turn, conn) = self.turn();
        let attempt = async {
            match (conn, node) {
                (Conn::Cluster(c), Some((host, port))) => {
                    let to = SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    };
                    let mut c = c.clone();
                    c.route_command(
                        super::connect::driver_cmd(&cmd),
                        RoutingInfo::SingleNode(to),
                    )
                    .await
                    .map(super::connect::reply_of)
                    .map_err(Failed::Cluster)
                }
                (conn, _) => conn.ask([&cmd]).await.map(|[reply]| reply),
            }
        };
        let reply = self.bounded(turn, attempt).await?;
        let page = match &reply {
            Reply::Array(parts) => match parts.as_slice() {
                [next, Reply::Array(keys)] => next
                    .bytes()
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok())
                    .zip(
                        keys.iter()
                            .map(|k| k.bytes().map(|k| k.to_vec()))
                            .collect::<Option<Vec<_>>>(),
                    ),
                _ => None,
            },
            _ => None,
        };
        page.ok_or_else(|| unavailable(NAME, format!("SCAN answered {reply:?}")))
    }
}

/// The `host` and `port` of each primary that serves slots and is not
/// failing, from a `CLUSTER NODES` reply.
fn cluster_primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if fields.len() < 9 || !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let address = fields[1].split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// `MATCH` pattern for keys starting with `prefix`: glob characters escaped.
fn glob_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_scans_visit_the_live_primaries_with_slots() {
        let nodes = "\
a1 127.0.0.1:7004@17004 slave a0 0 1 5 connected
a0 127.0.0.1:7000@17000 myself,master - 0 1 1 connected 0-5460
b0 10.0.0.2:7001@17001,host-b master - 0 1 2 connected 5461-10922
c0 127.0.0.1:7002@17002 master,fail - 0 1 3 disconnected 10923-16383
d0 127.0.0.1:7003@17003 master - 0 1 4 connected
";
        assert_eq!(
            cluster_primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 7000),
                ("10.0.0.2".to_owned(), 7001)
            ]
        );
    }

    #[test]
    fn glob_characters_in_prefixes_are_escaped() {
        assert_eq!(glob_prefix(r"a*b?[c]\"), r"a\*b\?\[c\]\\*");
    }
}
