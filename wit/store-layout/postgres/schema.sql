-- The PostgreSQL layout of idem's records (see ../README.md), schema version 2.
-- Every host runs this whole script, with {t} replaced by the table name
-- (1 to 48 characters of a-z, 0-9 and _, not starting with a digit), in one
-- transaction, before its first statement; it is idempotent and brings a
-- version 1 table up to version 2.
SELECT pg_advisory_xact_lock(hashtext('idem schema {t}'));
CREATE TABLE IF NOT EXISTS idem_schema (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL);
INSERT INTO idem_schema VALUES ('{t}', 2) ON CONFLICT (table_name) DO NOTHING;
CREATE TABLE IF NOT EXISTS {t} (
  key TEXT COLLATE "C" PRIMARY KEY,
  version BIGINT NOT NULL,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('processing', 'done')),
  lease_until_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  status INTEGER,
  header_names TEXT[],
  header_values BYTEA[],
  body BYTEA,
  holder BIGINT NOT NULL DEFAULT 0,
  phase TEXT,
  checkpoint BYTEA
);
CREATE INDEX IF NOT EXISTS {t}_expires ON {t} (expires_at_ms);
-- Version 1 to 2 (contract 0.2): the holder id of the claim that wrote the row
-- (0 in rows 0.1 hosts wrote, which keep working) and the last checkpoint.
DO $migrate$ BEGIN
  IF (SELECT version FROM idem_schema WHERE table_name = '{t}') = 1 THEN
    ALTER TABLE {t} ADD COLUMN IF NOT EXISTS holder BIGINT NOT NULL DEFAULT 0,
      ADD COLUMN IF NOT EXISTS phase TEXT, ADD COLUMN IF NOT EXISTS checkpoint BYTEA;
    UPDATE idem_schema SET version = 2 WHERE table_name = '{t}';
  END IF;
END $migrate$;
-- The functions of schema version 1, whose parameters had no holder and checkpoint.
DROP FUNCTION IF EXISTS {t}_try_claim(text, bigint, text, text, bigint, bigint, integer, text[], bytea[], bytea);
DROP FUNCTION IF EXISTS {t}_claim(text, bigint, text, text, bigint, bigint, integer, text[], bytea[], bytea);
-- Claims an absent or expired key: its new version, or NULL when a live row
-- (a concurrent claimer's, committed since the caller read) holds it.
CREATE OR REPLACE FUNCTION {t}_try_claim(
  p_key TEXT, p_now BIGINT, p_fp TEXT, p_state TEXT, p_lease BIGINT, p_exp BIGINT,
  p_status INTEGER, p_names TEXT[], p_values BYTEA[], p_body BYTEA,
  p_holder BIGINT, p_phase TEXT, p_checkpoint BYTEA)
RETURNS BIGINT
LANGUAGE plpgsql AS $fn$
DECLARE
  v BIGINT;
BEGIN
  -- The unique key lets exactly one concurrent claimer insert; the others
  -- wait for it to commit and insert nothing.
  INSERT INTO {t} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names,
    header_values, body, holder, phase, checkpoint)
  VALUES (p_key, 1, p_fp, p_state, p_lease, p_exp, p_status, p_names, p_values, p_body, p_holder, p_phase,
    p_checkpoint)
  ON CONFLICT (key) DO NOTHING
  RETURNING version INTO v;
  IF FOUND THEN
    RETURN v;
  END IF;
  -- Present: overwritten at its version + 1 if still expired when we hold its
  -- lock (a concurrent claimer that overwrote it first made it live again).
  UPDATE {t} r SET version = r.version + 1, fingerprint = p_fp, state = p_state, lease_until_ms = p_lease,
    expires_at_ms = p_exp, status = p_status, header_names = p_names, header_values = p_values, body = p_body,
    holder = p_holder, phase = p_phase, checkpoint = p_checkpoint
  WHERE r.key = p_key AND r.expires_at_ms <= p_now
  RETURNING r.version INTO v;
  RETURN v;
END
$fn$;
-- The whole claim in a loop, returning the row it found or the version it
-- wrote: for a claimer that lost a race to `{t}_try_claim`.
CREATE OR REPLACE FUNCTION {t}_claim(
  p_key TEXT, p_now BIGINT, p_fp TEXT, p_state TEXT, p_lease BIGINT, p_exp BIGINT,
  p_status INTEGER, p_names TEXT[], p_values BYTEA[], p_body BYTEA,
  p_holder BIGINT, p_phase TEXT, p_checkpoint BYTEA,
  OUT o_inserted BOOLEAN, OUT o_version BIGINT, OUT o_fingerprint TEXT, OUT o_state TEXT, OUT o_lease BIGINT,
  OUT o_exp BIGINT, OUT o_status INTEGER, OUT o_names TEXT[], OUT o_values BYTEA[], OUT o_body BYTEA,
  OUT o_holder BIGINT, OUT o_phase TEXT, OUT o_checkpoint BYTEA)
LANGUAGE plpgsql AS $fn$
BEGIN
  FOR attempt IN 1..10 LOOP
    -- Read first: a live record (a replay, a request in flight) is answered
    -- with no write and no lock. Each statement here takes a new snapshot, so
    -- this sees a row a concurrent claimer committed while we waited below.
    SELECT false, r.version, r.fingerprint, r.state, r.lease_until_ms, r.expires_at_ms, r.status,
      r.header_names, r.header_values, r.body, r.holder, r.phase, r.checkpoint
    INTO o_inserted, o_version, o_fingerprint, o_state, o_lease, o_exp, o_status, o_names, o_values, o_body,
      o_holder, o_phase, o_checkpoint
    FROM {t} r WHERE r.key = p_key;
    IF FOUND AND o_exp > p_now THEN
      RETURN;
    END IF;
    -- Absent or expired: `{t}_try_claim` inserts it or overwrites it at its
    -- version + 1, unless a concurrent claimer did so first (then the next
    -- attempt reads that claimer's row).
    o_version := {t}_try_claim(p_key, p_now, p_fp, p_state, p_lease, p_exp, p_status, p_names, p_values, p_body,
      p_holder, p_phase, p_checkpoint);
    IF o_version IS NOT NULL THEN
      -- Only the version is read when inserted (the other columns may hold the expired row).
      o_inserted := true;
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'idem: claim of % did not settle after 10 attempts', p_key;
END
$fn$;
