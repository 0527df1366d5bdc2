"""docs/architecture.md's "Transitions and the condition each checks" table is the store's
transition list: every row names a registered transition (``@transition`` in
app/orchestrator/store/), every registered transition has its row, and each registered one is a
module-level constant statement (no statement assembled at call time)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

from sqlalchemy import TextClause

import app.orchestrator.store as store_pkg
from app.orchestrator.store._sql import TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Transitions and the condition each checks"


def _load_store() -> dict[str, object]:
    modules = {}
    for info in pkgutil.iter_modules(store_pkg.__path__):
        modules[info.name] = importlib.import_module(f"{store_pkg.__name__}.{info.name}")
    return modules


def _table_names() -> tuple[set[str], set[str]]:
    """(named transitions, wildcard modules) of the table's first column."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(HEADING, 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append(line.split("|")[1])
    names, wildcards = set(), set()
    for cell in rows[1:]:  # the header row names the columns
        for ref in re.findall(r"`([a-z_]+)\.([a-z_*]+)`", cell):
            if ref[1] == "*":
                wildcards.add(ref[0])
            else:
                names.add(f"{ref[0]}.{ref[1]}")
    return names, wildcards


def test_every_transition_in_the_table_exists_and_every_transition_is_in_the_table():
    _load_store()
    names, _ = _table_names()
    assert names, "the table lists no transition"
    assert sorted(names - set(TRANSITIONS)) == [], "rows naming no registered store transition"
    assert sorted(set(TRANSITIONS) - names) == [], "registered transitions missing from docs/architecture.md"


def test_wildcard_rows_name_store_modules():
    modules = _load_store()
    _, wildcards = _table_names()
    assert wildcards <= set(modules), sorted(wildcards - set(modules))


def test_transitions_run_module_level_statements():
    """A transition's body executes a named constant (``conn.execute(NAME, …)``), never ``sql(…)``
    built inline, f-strings or concatenation."""
    modules = _load_store()
    for name in TRANSITIONS:
        module, fn_name = name.split(".")
        source = inspect.getsource(getattr(modules[module], fn_name))
        body = source.split('"""', 2)[-1]  # after the docstring
        assert "sql(" not in body, f"{name} builds its statement inline"
        assert not re.search(r"\bf\"[^\"]*\b(SELECT|UPDATE|INSERT|DELETE|WHERE)\b", body), f"{name} formats SQL"
        constants = re.findall(r"conn\.execute\(\s*([A-Z_]+)\b", body)
        assert constants, f"{name} runs no named statement"
        for constant in constants:
            assert isinstance(getattr(modules[module], constant), TextClause), f"{name}: {constant} is no statement"


def test_the_batched_claims_cost_each_batched_stage_as_it_declares():
    from app.orchestrator.stages import STAGES
    from app.orchestrator.store import tasks

    batched = [s for s in STAGES if s.batched]
    assert batched
    for statement in (tasks.CLAIM_GROUP, tasks.CLAIM_FAIR_BATCH):
        for s in batched:
            assert f"WHEN t.lane = '{s.lane.value}' THEN {s.batch_cost_sql}" in statement.text


def test_has_pending_names_the_predicate_the_webhook_claim_spells_out():
    from app.orchestrator.store import webhooks

    assert webhooks.HAS_PENDING in " ".join(webhooks.CLAIM.text.split())


def _words(statement) -> str:
    """Whitespace-insensitive form of a statement (its layout may differ from a fragment's)."""
    text = getattr(statement, "text", statement)
    return re.sub(r"\( ", "(", re.sub(r" \)", ")", " ".join(text.split())))


def test_serving_statements_spell_out_current_and_needs():
    from app.orchestrator.store import serving, serving_fill

    for kind in ("text", "visual"):
        assert _words(serving.CURRENT[kind].format(m=":m", d=":d", p=":p")) in _words(serving.COVERAGE[kind])
        assert _words(serving.NEEDS[kind]) in _words(serving.COVERAGE[kind])
        fill = _words(serving.CURRENT[kind].format(m="fm.model", d="fm.dims", p="fm.pv"))
        for statement in (serving_fill.COUNT_NEEDING_FILL[kind], serving_fill.FILL_PAGE[kind]):
            assert f"WHERE NOT {fill}" in _words(statement)
            assert _words(serving.NEEDS[kind]) in _words(statement)
    assert _words(serving.CURRENT["text"].format(m=":t", d=":td", p=":tp")) in _words(serving.CUTOVER_TEXT)
    assert _words(serving.CURRENT["visual"].format(m=":t", d=":td", p=":tp")) in _words(serving.CUTOVER_VISUAL)
    assert _words(serving.NEEDS["text"]) in _words(serving.CUTOVER_TEXT)
    assert _words(serving.NEEDS["visual"]) in _words(serving.CUTOVER_VISUAL)


def test_has_due_spells_out_has_pending():
    from app.orchestrator.store import webhooks

    assert _words(webhooks.HAS_PENDING) in _words(webhooks.HAS_DUE)


def test_the_webhook_fairness_statements_spell_out_waiting_and_in_flight():
    from app.orchestrator.store import webhooks

    for statement in (webhooks.CLAIM, webhooks.DUE_FOR_HINT, webhooks.FAIRER_SCOPE_WAITING):
        assert _words(webhooks.WAITING) in _words(statement)
        assert _words(webhooks.IN_FLIGHT) in _words(statement)


#: Store modules whose statements take a part per stage from the stage declarations: the planner's
#: validity facts (and the batched claims' cost CASE) — built once at import by the stage registry's
#: design (docs/architecture.md "Stages: declared once"), not assembled by hand.
STAGE_BUILT = {"artifacts.py", "jobs.py", "facts.py", "tasks.py"}


def test_store_builds_no_statement_from_fragments():
    """No other store module formats SQL at import or call time (``.format``, f-strings, ``{NAME}``)."""
    for path in sorted((ROOT / "app" / "orchestrator" / "store").glob("*.py")):
        if path.name in STAGE_BUILT:
            continue
        source = path.read_text()
        assert ".format(" not in source, path.name
        assert not re.search(r"\bf\"[^\"]*\b(SELECT|UPDATE|INSERT|DELETE|WHERE|FROM|RETURNING)\b", source), path.name
        assert not re.search(r"\{[A-Z_]+(\[[a-z]+\])?\}", source), path.name
