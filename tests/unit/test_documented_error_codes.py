"""Every stable error code the API can answer with is in the README's list of error codes, and the
list names no code the API never answers with: a newcomer reading it is never misled.

The codes are read from the source (nothing runs): ``ApiError(status, "code")``,
``error_response(status, "code")`` and ``OutboundRefused("code", …)`` calls; for every domain error
the API's handler turns into a response (``OrchestratorError``'s subclasses, ``Unauthorized``,
``CsrfRejected``) each ``code="…"`` passed to it, and its class's default code when some call
passes none; the handler's own tables (field codes, HTTP statuses, the gunicorn worker's
server-layer codes) and the codes ``_validation_code`` returns.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.api.errors import FIELD_CODES, HTTP_CODES
from app.api.server import SERVER_CODES, TIMEOUT_CODE
from app.auth import Unauthorized
from app.orchestrator.errors import OrchestratorError
from app.web.csrf import CsrfRejected

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Error codes"
#: Domain codes app/ raises where no API request reaches them (the CLI's, or a worker's).
NOT_API = {
    "invalid_limit": "memeflow scopes limits only",
    "invalid_kind": "the CLI's --kind; the API's schema answers validation_error first",
    "unstorable_result": "a worker's commit; it becomes a job's error, not a response",
}


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def raised_codes() -> set[str]:
    """The error codes app/ can put in an API response's ``error`` field."""
    domain = {OrchestratorError, Unauthorized, CsrfRejected} | _subclasses(OrchestratorError)
    domain_names = {c.__name__ for c in domain}
    defaults = {c.__name__: c.code for c in domain}
    codes = set(FIELD_CODES.values()) | set(HTTP_CODES.values()) | set(SERVER_CODES.values()) | {TIMEOUT_CODE}
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "_validation_code":
                codes |= {s for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None
                          for s in [_str(r.value)] if s}
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in ("ApiError", "error_response") and len(node.args) >= 2 and _str(node.args[1]):
                codes.add(_str(node.args[1]))
            elif name == "OutboundRefused" and node.args and _str(node.args[0]):
                codes.add(_str(node.args[0]))
            elif name in domain_names:
                given = [k.value for k in node.keywords if k.arg == "code"]
                if not given:
                    codes.add(defaults[name])
                codes |= {s for v in given for s in [_str(v)] if s}
    return codes - set(NOT_API)


def documented_codes() -> set[str]:
    """The codes in README.md's error-code table (its rows, in the section up to the next heading)."""
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return {code for row in rows for code in re.findall(r"`([a-z][a-z0-9_]*)`", row)}


def test_every_error_code_the_api_answers_with_is_documented():
    missing = sorted(raised_codes() - documented_codes())
    assert not missing, f"error codes raised in app/ but missing from README.md {SECTION}: {missing}"


def test_the_documented_list_names_no_code_the_api_never_answers_with():
    stale = sorted(documented_codes() - raised_codes())
    assert not stale, f"README.md {SECTION} lists codes app/ never answers with: {stale}"
