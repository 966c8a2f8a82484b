-- The statements every PostgreSQL store runs, each `-- name: NAME` then
-- its text up to the next name; {t} is the table name. See ../README.md.

-- name: claim
-- A claim: the live or expired row's columns (all NULL when absent), then the
-- version {t}_try_claim wrote when the row was absent or expired (NULL when
-- a concurrent claimer won: then run `settle`). $1 key, $2 now_ms, $3
-- fingerprint, $4 state, $5 lease_until_ms, $6 expires_at_ms, $7 status,
-- $8 header names, $9 header values, $10 body, $11 holder, $12 phase,
-- $13 checkpoint data.
SELECT r.*, CASE WHEN r.expires_at_ms > $2 THEN NULL ELSE {t}_try_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) END FROM (SELECT 1) AS one LEFT JOIN (SELECT version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body, holder, phase, checkpoint FROM {t} WHERE key = $1) r ON true;

-- name: settle
-- The claim of a caller that lost a race to {t}_try_claim: the same
-- parameters; o_inserted with o_version, or the live row it found.
SELECT * FROM {t}_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13);

-- name: get
-- The live record of a key: $1 key, $2 now_ms.
SELECT version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body, holder, phase, checkpoint FROM {t} WHERE key = $1 AND expires_at_ms > $2;

-- name: replace
-- Overwrites the live row at version $2: $1 key, $3 now_ms, then the record
-- ($4 fingerprint … $14 checkpoint data, in `claim`'s order). One row
-- updated means written, at version $2 + 1.
UPDATE {t} SET version = version + 1, fingerprint = $4, state = $5, lease_until_ms = $6, expires_at_ms = $7, status = $8, header_names = $9, header_values = $10, body = $11, holder = $12, phase = $13, checkpoint = $14 WHERE key = $1 AND version = $2 AND expires_at_ms > $3;

-- name: delete
-- Removes the row live at $3 (now_ms), at version $2 only unless $2 is NULL.
DELETE FROM {t} WHERE key = $1 AND ($2::BIGINT IS NULL OR version = $2) AND expires_at_ms > $3;

-- name: now
-- The server's clock, the store's time authority (wit/clock.wit): milliseconds
-- since the Unix epoch, from clock_timestamp() (the time now, not the
-- transaction's start).
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT;

-- name: list
-- The operator's listing: keys LIKE $1 live at $2, in state $3 (NULL: any),
-- after key $4 (NULL: from the start), at most $5.
SELECT key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body, holder, phase, checkpoint FROM {t} WHERE key LIKE $1 AND expires_at_ms > $2 AND ($3::TEXT IS NULL OR state = $3) AND ($4::TEXT IS NULL OR key > $4 COLLATE "C") ORDER BY key LIMIT $5;

-- name: purge
-- Frees the space of at most $2 rows expired at $1.
DELETE FROM {t} WHERE expires_at_ms <= $1 AND key IN (SELECT key FROM {t} WHERE expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED);
