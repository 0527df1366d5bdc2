"""The sweep's statistics step: a hot table that changed more rows than it held at its last
analysis is ANALYZEd at the next sweep (a burst into an empty database must not run on plans cached
while the tables were tiny: docs/performance-log.md §45); below the bound it is left to autovacuum,
and a table whose lock autovacuum holds is deferred to the next sweep, not failed."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator.store import sweep as q
from tests.support.pipeline import png_bytes, store_and_ingest

CHANGES = 40


def _change_tasks(engine, rounds: int) -> None:
    """``rounds`` × every task row updated, reported to the statistics system at commit."""
    with engine.begin() as conn:
        for _ in range(rounds):
            conn.execute(text("UPDATE tasks SET updated_at = updated_at"))
        conn.execute(text("SELECT pg_stat_force_next_flush()"))


def _last_analyze(engine, table: str):
    with engine.connect() as conn:
        return conn.execute(text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = :t"),
                            {"t": table}).scalar()


def _grown_setup(engine, settings, min_changes: int) -> Orchestrator:
    orch = Orchestrator(engine, dataclasses.replace(settings, sweep_analyze_min_changes=min_changes))
    for i in range(4):
        store_and_ingest(orch, "local", png_bytes(300 + i))
    _change_tasks(engine, CHANGES // 4)  # 4 tasks × 10 rounds: 40 changed rows since no analysis
    return orch


def test_a_hot_table_that_grew_is_analyzed_by_the_next_sweep(engine, settings):
    orch = _grown_setup(engine, settings, min_changes=CHANGES)
    assert _last_analyze(engine, "tasks") is None
    with engine.connect() as conn:
        assert "tasks" in q.grown_tables_txn(conn, CHANGES, 1.0)
    report = orch.sweep()
    assert not report.failed_steps, report.failed_steps
    assert report.counts["tables_analyzed"] >= 1 and report.counts["tables_analyze_deferred"] == 0
    assert _last_analyze(engine, "tasks") is not None
    with engine.connect() as conn:  # analyzed: its changes start again from 0
        assert "tasks" not in q.grown_tables_txn(conn, CHANGES, 1.0)


def test_a_table_below_the_bound_is_left_to_autovacuum(engine, settings):
    orch = _grown_setup(engine, settings, min_changes=10 * CHANGES)
    report = orch.sweep()
    assert report.counts["tables_analyzed"] == 0 and not report.failed_steps
    assert _last_analyze(engine, "tasks") is None
    off = Orchestrator(engine, dataclasses.replace(settings, sweep_analyze_min_changes=0))
    assert off.sweep().counts["tables_analyzed"] == 0  # 0: the step is off
    assert _last_analyze(engine, "tasks") is None


def test_a_table_autovacuum_holds_is_deferred_to_the_next_sweep(engine, settings):
    orch = _grown_setup(engine, settings, min_changes=CHANGES)
    with engine.connect() as holder:  # what autovacuum holds while it works on a table
        holder.execute(text("LOCK TABLE tasks IN SHARE UPDATE EXCLUSIVE MODE"))
        report = orch.sweep()
        assert not report.failed_steps, report.failed_steps  # deferred, not a failed step
        assert report.counts["tables_analyze_deferred"] >= 1
        assert _last_analyze(engine, "tasks") is None
        holder.rollback()
    report = orch.sweep()
    assert report.counts["tables_analyze_deferred"] == 0 and _last_analyze(engine, "tasks") is not None


def test_only_hot_tables_can_be_analyzed(engine):
    with engine.begin() as conn:
        try:
            q.analyze_table_txn(conn, 'tasks"; DROP TABLE images; --', 100)
        except ValueError:
            pass
        else:  # pragma: no cover - the guard is the point
            raise AssertionError("a name outside HOT_TABLES reached ANALYZE")


def test_a_table_whose_analyze_fails_does_not_keep_the_others_unanalyzed(engine, settings, monkeypatch):
    """The step analyzed its grown tables one after the other, in name order: one whose ANALYZE
    raised (a statement timeout, a cancel) ended the step, and while it kept failing no table after
    it in that order was analyzed by any sweep."""
    from sqlalchemy.exc import OperationalError

    orch = _grown_setup(engine, settings, min_changes=CHANGES)
    real_grown, real_analyze = q.grown_tables_txn, q.analyze_table_txn

    def grown(conn, min_changes, ratio):
        return sorted({"job_stages", *real_grown(conn, min_changes, ratio)})  # job_stages sorts before tasks

    def analyze(conn, table, lock_timeout_ms):
        if table == "job_stages":
            raise OperationalError('ANALYZE "job_stages"', {}, Exception("canceling statement due to statement timeout"))
        return real_analyze(conn, table, lock_timeout_ms)

    monkeypatch.setattr(q, "grown_tables_txn", grown)
    monkeypatch.setattr(q, "analyze_table_txn", analyze)
    report = orch.sweep()
    assert [f["step"] for f in report.failed_steps] == ["statistics"]  # still told
    assert _last_analyze(engine, "tasks") is not None
