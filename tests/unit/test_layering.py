"""The import layering of app/ (docs/architecture.md "Layers"), read from the source with ast.

From the bottom up: ``app.stages`` (pure providers) → ``app.orchestrator`` / ``app.search`` (state
and reads) → ``app.worker``, ``app.api``, ``app.cli`` (the processes). A lower package never
imports a higher one, so providers and stage configs never reach up into the worker; the API and
CLI take providers from ``app.stages.providers`` and publish hints through ``app.publisher``.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
PROCESSES = ("app.worker", "app.api", "app.cli", "app.ops", "app.library")
#: The only worker modules the API and CLI may import: publishing hints to the broker after a
#: commit (API, CLI) and starting worker processes (the CLI's supervisor). Never providers or runs.
API_MAY_IMPORT_FROM_WORKER = frozenset({"app.publisher"})
CLI_MAY_IMPORT_FROM_WORKER = frozenset({"app.publisher", "app.worker.broker", "app.worker.celery_app"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> list[tuple[str, str]]:
    """Every (importing module, imported app module) pair, lazy imports inside functions included."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found += [(_module_name(path), name) for name in names if name == "app" or name.startswith("app.")]
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(importer: str, forbidden: tuple[str, ...], allowed: frozenset[str] = frozenset()) -> list[str]:
    return sorted({
        f"{src} imports {dst}" for src, dst in _imports()
        if _within(src, importer) and any(_within(dst, p) for p in forbidden)
        and not any(_within(dst, a) for a in allowed)
        # ``from app.worker import publisher`` names the package too: judged by its module entry
        and dst not in forbidden
    })


def test_the_imports_are_found():
    pairs = _imports()
    assert ("app.orchestrator.service", "app.orchestrator.execution") in pairs
    assert any(src == "app.worker.runtime" and dst == "app.stages.providers" for src, dst in pairs)


def test_stages_import_nothing_above_them():
    assert _violations("app.stages", ("app.orchestrator", "app.search", *PROCESSES)) == []


def test_the_orchestrator_and_search_never_import_a_process_package():
    assert _violations("app.orchestrator", PROCESSES) == []
    assert _violations("app.search", PROCESSES) == []
    assert _violations("app.db", ("app.orchestrator", "app.stages", "app.search", *PROCESSES)) == []


def test_the_api_never_imports_the_worker_and_the_cli_only_its_broker_url():
    assert _violations("app.api", ("app.worker",)) == []
    assert _violations("app.cli", ("app.worker",), CLI_MAY_IMPORT_FROM_WORKER) == []


def test_a_violation_is_reported():
    # the checker itself can fail: the worker does import the orchestrator
    assert _violations("app.worker", ("app.orchestrator",)) != []


def test_no_module_imports_another_modules_private_names():
    """A leading underscore means "this module's own": a name another module needs is public (and
    documented as such), so a refactor of its module can tell who depends on it."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("app"):
                found += [f"{_module_name(path)} imports {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []
