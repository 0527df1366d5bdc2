"""The first claim's one-statement admission (store/slots.py ADMIT_FIRST) spells out the fairness
read's two CTEs (FAIRER_SCOPE_WAITING: the waiting pairs, each pair's best due task) and its
"fairer scope waits" test; a change to one that is not made to the other fails here."""

from __future__ import annotations

from app.orchestrator.store import slots


def _between(statement: str, start: str, end: str) -> str:
    i = statement.index(start)
    return statement[i:statement.index(end, i)]


def test_the_admission_reads_fairness_exactly_as_the_fairness_read_does():
    fair, admit = slots.FAIRER_SCOPE_WAITING.text, slots.ADMIT_FIRST.text
    ctes = _between(fair, "WITH RECURSIVE w AS (", "\n)\nSELECT EXISTS")
    assert ctes in admit
    fairer = _between(fair, "SELECT EXISTS (SELECT 1 FROM h", ", 0))") + ", 0))"
    assert " ".join(fairer.split()) in " ".join(admit.split())  # the same test, indented differently


def test_the_admission_reads_unhinted_waiting_exactly_as_the_release_path_does():
    """ADMIT_FIRST's ``unhinted`` column is UNHINTED_WAITING spelled out: the admitted claim's top-up
    (lanes.top_up_txn) and the slot release's hint (lanes.next_fair_hints_txn) ask one question."""
    unhinted = " ".join(slots.UNHINTED_WAITING.text.split())
    assert unhinted in " ".join(slots.ADMIT_FIRST.text.split())
