"""events_flush_once: the outbox's commit-time step returns at once for rows already moved

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07

``event_pending_flush`` is a deferred per-row trigger: a transaction that staged N events fires it N
times at commit. The first firing moves every staged row of the transaction (and deletes them); each
later one still looked them up by ``txid`` — through the index entries of the rows just deleted — so
a commit cost O(N²) while holding the scope's event lock (2,000 events 0.57 s, 8,000 events 7.5 s).
A firing whose own row is gone now returns at once (a primary-key probe).
"""

from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None

_BODY = """
DECLARE k bigint; r record; me bigint := txid_current();
BEGIN
  {guard}
  FOR k IN SELECT DISTINCT hashtextextended('memeflow.events:' || scope_id, 0) AS h
           FROM event_pending WHERE txid = me ORDER BY h LOOP
    PERFORM pg_advisory_xact_lock(k);
  END LOOP;
  FOR r IN SELECT * FROM event_pending p WHERE p.txid = me ORDER BY p.pk LOOP
    INSERT INTO events (id, scope_id, type, job_id, image_id, batch_id, payload, created_at)
    SELECT nextval('events_id_seq'), r.scope_id, r.type, r.job_id, r.image_id, r.batch_id, r.payload,
           clock_timestamp()
    WHERE EXISTS (SELECT 1 FROM scopes s WHERE s.id = r.scope_id);  -- a scope deleted in this txn: none
  END LOOP;
  DELETE FROM event_pending WHERE txid = me;
  RETURN NULL;
END"""

_GUARD = ("IF NOT EXISTS (SELECT 1 FROM event_pending WHERE pk = NEW.pk) THEN\n"
          "    RETURN NULL;  -- an earlier firing of this commit moved it with the rest\n"
          "  END IF;")


def _function(guard: str) -> str:
    return ("CREATE OR REPLACE FUNCTION memeflow_events_flush() RETURNS trigger LANGUAGE plpgsql AS $$"
            + _BODY.format(guard=guard) + " $$;")


def upgrade() -> None:
    op.execute(_function(_GUARD))


def downgrade() -> None:
    op.execute(_function(""))
