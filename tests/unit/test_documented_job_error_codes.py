"""Every ``error.code`` a job, stage, task or attempt can carry is in docs/operations.md's table of
job error codes, and the table names no code app/ never stores: an operator reading a failed job's
code always finds what it means and what to do.

The codes are read from the source (nothing runs):

- every call of ``StageError`` or a subclass (``RetryableError``, ``PermanentError``,
  ``OutcomeUnknownError``, ``ProviderConfigMismatch`` …): its ``code=`` and ``exhausted_code=``, or
  the class's default code when the call gives none;
- the policy's ``Denial(code, …)`` and the denial codes app/orchestrator/policy.py declares for
  any policy (``FORBIDDEN``, ``LIMIT_EXCEEDED``, ``UNAVAILABLE``: a blocked job's code);
- the orchestrator's own job endings: ``end_job_txn(orch, conn, job, status, code, msg)``,
  ``stored_error(code, msg)``, ``RetryDecision(code=…)``, ``abandon_task``'s reason,
  ``cancel_job_tasks_txn``'s reason, the codes ``_stale_reason`` returns, and every
  ``{"code": …, "message": …}`` literal in app/orchestrator and app/worker (the shape an error
  is stored in).

A code given as a module-level name (``FORBIDDEN``) or a dict of codes is resolved to its strings.
A code given as an expression that only forwards a code collected elsewhere (``error.code``) must
be listed in ``FORWARDED``; a new unresolved expression fails the test, so a code cannot slip past
unseen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.orchestrator import policy
from app.stages.errors import StageError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
SECTION = "### Job error codes"

#: Codes a StageError carries where it never becomes a job's error.
NOT_JOB = {
    "invalid_weights": "a composite text provider's query weights: search time, never a job's stage",
}
#: ``{"code": …, "message": …}`` literals that are not a job's error.
NOT_JOB_MODULES = {
    "app/orchestrator/liveness.py": "/readyz and /ops liveness problems",
}
#: (module, expression) giving a code that was collected where it was made.
FORWARDED = {
    ("app/orchestrator/execution.py", "clean(code, ERROR_CODE_MAX)"): "stored_error's parameter; its callers are read",
    ("app/orchestrator/execution.py", "reason"): "_stale_reason's returns, or abandon_task's reason",
    ("app/orchestrator/execution.py", "decision.code or error.code"): "a RetryDecision's or StageError's code",
    ("app/orchestrator/replan.py", "error.code"): "a ProviderConfigMismatch's code",
    ("app/orchestrator/retry.py", "error.code"): "the StageError's own code",
    ("app/orchestrator/policy.py", "code"): "Denial's parameter; its callers are read",
    ("app/orchestrator/advance.py", "code"): "end_job_txn's parameter; its callers are read",
    ("app/orchestrator/advance.py", "status"): "a job's terminal status used as its tasks' cancel reason",
    ("app/orchestrator/store/tasks.py", "reason"): "cancel_job_tasks_txn's parameter; its callers are read",
    ("app/orchestrator/webhooks.py", "code"): "a webhook delivery failure's code (docs/events.md), no job's",
}
#: Functions whose string returns are codes.
CODE_FUNCTIONS = {"_stale_reason"}
#: Calls whose argument (position, or keyword) is a code.
#: advance.end_job_txn(orch, conn, job, status, code, msg) only: the store's has 5 arguments (its
#: error dict is read where it is built).
CODE_ARGS = {"Denial": (0, "code"), "end_job_txn": (4, "code"), "stored_error": (0, "code"),
             "cancel_job_tasks_txn": (3, "reason"), "RetryDecision": (None, "code")}
ARG_COUNTS = {"end_job_txn": 6}


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _module_strings(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level ``NAME = …`` assignments (constants and dicts of codes)."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _strings(expr: ast.AST, names: dict[str, ast.AST]) -> set[str]:
    """The string constants an expression can give, module-level names resolved (dict values only)."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "getattr":
        return set()  # getattr(error, "exhausted_code", None): an attribute's name, not a code
    if isinstance(expr, ast.Constant):
        return {expr.value} if isinstance(expr.value, str) else set()
    if isinstance(expr, ast.Name):
        value = names.get(expr.id)
        if value is None:
            return set()
        return _strings(ast.Tuple(elts=value.values, ctx=ast.Load()) if isinstance(value, ast.Dict) else value, {})
    return {s for child in ast.iter_child_nodes(expr) for s in _strings(child, names)}


_FORWARDED_SEEN: set[tuple[str, str]] = set()


def _code(path: Path, expr: ast.AST, names: dict[str, ast.AST], unresolved: list[str]) -> set[str]:
    got = _strings(expr, names)
    key = (str(path.relative_to(ROOT)), ast.unparse(expr))
    if not got and key in FORWARDED:
        _FORWARDED_SEEN.add(key)
    elif not got:
        unresolved.append(f"{key[0]}:{expr.lineno}: {key[1]}")
    return got


def raised_codes() -> tuple[set[str], list[str]]:
    """The codes app/ can store as a job's, stage's, task's or attempt's error, and the code
    expressions it could not resolve (neither a string nor a known forwarding)."""
    stage_errors = {StageError} | _subclasses(StageError)
    defaults = {c.__name__: c.code for c in stage_errors}
    codes = {policy.FORBIDDEN, policy.LIMIT_EXCEEDED, policy.UNAVAILABLE}
    unresolved: list[str] = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), rel)
        names = _module_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in CODE_FUNCTIONS:
                codes |= {s for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None
                          for s in _strings(r.value, names)}
            if isinstance(node, ast.FunctionDef) and node.name == "abandon_task":
                codes |= {s for d in node.args.defaults for s in _strings(d, names)}
            if (isinstance(node, ast.Dict) and rel.startswith(("app/orchestrator/", "app/worker/"))
                    and rel not in NOT_JOB_MODULES
                    and {_str(k) for k in node.keys} == {"code", "message"}):
                value = node.values[[_str(k) for k in node.keys].index("code")]
                codes |= _code(path, value, names, unresolved)
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            keywords = {k.arg: k.value for k in node.keywords}
            if name in defaults:
                if "code" in keywords:
                    codes |= _code(path, keywords["code"], names, unresolved)
                else:
                    codes.add(defaults[name])
                if "exhausted_code" in keywords:
                    codes |= _code(path, keywords["exhausted_code"], names, unresolved)
            elif name in CODE_ARGS:
                position, keyword = CODE_ARGS[name]
                if name in ARG_COUNTS and len(node.args) + len(node.keywords) != ARG_COUNTS[name]:
                    continue
                if keyword in keywords:
                    codes |= _code(path, keywords[keyword], names, unresolved)
                elif position is not None and len(node.args) > position:
                    codes |= _code(path, node.args[position], names, unresolved)
    return codes - set(NOT_JOB), unresolved


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def documented_codes() -> set[str]:
    """The codes in the first column of docs/operations.md's job error-code table."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/operations.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|--")]
    return {code for row in rows[1:] for code in re.findall(r"`([a-z][a-z0-9_]*)`", row.split("|")[1])}


def test_every_code_expression_is_resolved():
    _, unresolved = raised_codes()
    assert not unresolved, ("job error codes given by expressions this test cannot read; give a string, or "
                            f"list the expression in FORWARDED if it only forwards a code read elsewhere: {unresolved}")


def test_every_forwarding_listed_is_still_in_the_source():
    raised_codes()
    stale = sorted(set(FORWARDED) - _FORWARDED_SEEN)
    assert not stale, f"FORWARDED lists expressions app/ no longer has: {stale}"


def test_every_job_error_code_is_documented():
    missing = sorted(raised_codes()[0] - documented_codes())
    assert not missing, f"job error codes stored by app/ but missing from docs/operations.md {SECTION}: {missing}"


def test_the_documented_table_names_no_code_app_never_stores():
    stale = sorted(documented_codes() - raised_codes()[0])
    assert not stale, f"docs/operations.md {SECTION} lists codes app/ never stores: {stale}"


def test_the_collector_sees_the_codes_each_rule_stands_for():
    """Each reading rule finds what it is there for (else a refactor could blind it silently)."""
    codes = raised_codes()[0]
    assert {"file_corrupt", "file_missing", "file_unreadable", "worker_died", "max_attempts_exceeded",
            "operation_forbidden", "operation_limit_exceeded", "operation_policy_unavailable",
            "target_changed", "context_changed", "superseded", "cancelled", "image_deleted",
            "provider_config_mismatch", "agent_outcome_unknown", "unknown_execution"} <= codes
