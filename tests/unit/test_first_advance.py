"""The first advance of an upload's job reads no facts (app/orchestrator/advance.py
``_first_advance_txn``): it takes every stage's artifact as missing for an image inserted in the
same transaction. That holds while each stage's validity query needs a row of that image id — a
conjunction led by ``EXISTS (… image_id = {image} …)`` — which no other transaction can know before
the upload commits. A stage declared otherwise must not take that shortcut: this test fails."""

from __future__ import annotations

import pytest

from app.orchestrator import stages
from tests.unit.test_stage_registry_fourth import THUMBNAIL


def _leading_exists(query: str) -> tuple[str, str]:
    """(the body of the leading ``EXISTS (…)``, what follows it)."""
    assert query.startswith("EXISTS ("), query
    depth = 0
    for i, ch in enumerate(query[len("EXISTS "):], len("EXISTS ")):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return query[len("EXISTS ("):i], query[i + 1:]
    raise AssertionError(f"unbalanced: {query}")


def _top_level(sql: str) -> str:
    """``sql`` without anything inside parentheses."""
    out, depth = [], 0
    for ch in sql:
        depth += ch == "("
        if depth == 0:
            out.append(ch)
        depth -= ch == ")"
    return "".join(out)


@pytest.mark.parametrize("spec", [*stages.EXISTS_STAGES, THUMBNAIL], ids=lambda s: s.stage.value)
def test_every_validity_query_needs_a_row_of_the_image(spec):
    body, rest = _leading_exists(spec.exists_sql)
    assert ".image_id = {image}" in body
    assert rest == "" or rest.split()[0] == "AND", "the leading EXISTS must be a conjunct of the whole query"
    assert "OR" not in _top_level(rest).upper().split(), "the leading EXISTS must be a conjunct of the whole query"


def test_the_check_refuses_a_query_that_does_not_need_the_image():
    body, _ = _leading_exists("EXISTS (SELECT 1 FROM thumbnails th WHERE th.image_sha256 = {sha})")
    assert ".image_id = {image}" not in body
    _, rest = _leading_exists("EXISTS (SELECT 1 FROM t WHERE t.image_id = {image}) AND x OR EXISTS (SELECT 1)")
    assert "OR" in _top_level(rest).upper().split()
