"""bench/task_row_cost.py compares ``tasks`` with a narrow hot-state design (docs/performance-log.md
§53). Its figure means something only while the narrow design carries the same indexes as ``tasks``
and both designs really run a task's life to the end."""

from __future__ import annotations

import re

import psycopg
import pytest

from bench import task_row_cost as bench


def _conn(db_url: str) -> psycopg.Connection:
    return psycopg.connect(bench.libpq_url(db_url))


def _index_shapes(conn, table: str) -> set[str]:
    """Each index of ``table`` without its name and table: uniqueness, method, keys, predicate."""
    with conn.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = %s", (table,))
        defs = [r[0] for r in cur.fetchall()]
    return {re.sub(r"^CREATE (UNIQUE )?INDEX \S+ ON public\.\S+ ", r"\1", d) for d in defs}


def test_narrow_design_has_the_indexes_of_tasks(db_url):
    with _conn(db_url) as conn:
        bench.prepare(conn, 1)
        real = _index_shapes(conn, "tasks")
        narrow = _index_shapes(conn, "bench_task_static") | _index_shapes(conn, "bench_task_hot")
    assert len(real) >= 10
    assert narrow == real


@pytest.mark.parametrize("design", list(bench.VARIANTS))
def test_each_design_runs_every_task_to_succeeded(db_url, design):
    with _conn(db_url) as conn:
        jobs = bench.prepare(conn, 20)
        result = bench.run_variant(conn, design, jobs, batch=8)  # raises unless 60 tasks succeeded
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {bench.VARIANTS[design][4]}")
            assert cur.fetchone()[0] == 60
    assert result["cpu_us"] >= 0 and result["wal_b"] > 0
