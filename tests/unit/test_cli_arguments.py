"""Command-line arguments that are not text (bytes that are not UTF-8 reach ``sys.argv`` as lone
surrogates) are a usage error naming the argument, before any command connects or writes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.cli import main

NOT_UTF8 = "a\udcffb"  # what Python makes of the bytes b"a\xffb" in argv


@pytest.mark.parametrize("args", [
    ["search", NOT_UTF8],
    ["search", "cat", "--scope", NOT_UTF8],
    ["scopes", "create", NOT_UTF8],
    ["tokens", "revoke", NOT_UTF8],
    ["tokens", "create", "local", "--name", NOT_UTF8],
    ["process-all", "--scope", NOT_UTF8],
    ["ingest", NOT_UTF8],
])
def test_an_argument_that_is_not_utf8_is_a_usage_error(args, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(tmp_path / "var"))  # nothing runs there
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "'a\\xffb' is not valid UTF-8 text" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "var").exists()


def test_a_file_name_that_is_not_utf8_still_names_its_directory(tmp_path, monkeypatch):
    """Linux file names are bytes: an existing directory whose name is not UTF-8 is a valid argument."""
    import os

    directory = os.fsdecode(os.fsencode(str(tmp_path)) + b"/in\xff")
    os.mkdir(directory)
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(tmp_path / "var"))
    r = CliRunner().invoke(main, ["ingest", directory, "--help"])
    assert r.exit_code == 0 and "not valid UTF-8" not in r.output, r.output
    # as an --option=value, and a new file in an existing directory (a path to write)
    for arg in (f"--schedule={directory}", os.path.join(directory, "new\udcff-file")):
        r = CliRunner().invoke(main, ["ingest", arg, "--help"])
        assert "not valid UTF-8" not in r.output, (arg, r.output)


@pytest.mark.parametrize("scope", ["a/b", "..", "", "x" * 129, "tab\there"])
@pytest.mark.parametrize("args", [
    ["process-all", "--scope", "{}"],
    ["ingest", "{dir}", "--scope", "{}"],
    ["search", "cat", "--scope", "{}"],
    ["status", "--scope", "{}"],
    ["search-model", "status", "--scope", "{}"],
    ["search-model", "cutover", "--scope", "{}"],
    ["scopes", "limits", "{}", "--max-images", "5"],
    ["tokens", "create", "{}", "--name", "n"],
    ["tokens", "revoke", "n", "--scope", "{}"],
    ["tokens", "list", "--scope", "{}"],
])
def test_an_invalid_scope_id_is_a_usage_error(args, scope, tmp_path, monkeypatch):
    """A scope id the API would refuse is refused by every command that takes one (exit 2, the rule
    named), before it reaches the database: it was an IntegrityError traceback from process-all."""
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(tmp_path / "var"))  # nothing runs there
    argv = [a.format(scope, dir=tmp_path) for a in args]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, (argv, r.exit_code, r.output, r.exception)
    assert "invalid scope id" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999"])
@pytest.mark.parametrize("args", [
    ["gc", "--min-age", "{}"],
    ["process-all", "--wait", "--timeout", "{}"],
    ["status", "--interval", "{}"],
])
def test_a_duration_must_be_a_finite_number(args, value, tmp_path, monkeypatch):
    """'nan' and 'inf' parse as floats and pass a range check (nan compares false with every bound):
    a --timeout of nan never expired, an --interval of nan crashed the sleep. Refused up front."""
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(tmp_path / "var"))  # nothing runs there
    argv = [a.format(value) for a in args]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, (argv, r.exit_code, r.output, r.exception)
    assert ("finite number of seconds" in r.output or value == "-inf") and "Traceback" not in r.output, r.output
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize("args", [
    ["api", "--port", "70000"],
    ["api", "--port", "-1"],
    ["api", "--workers", "0"],
    ["api", "--workers", "-2"],
    ["worker", "--lane", "visual", "-c", "-1"],
    ["flower", "--port", "99999"],
    ["up", "-c", "-1"],
    ["up", "--concurrency", "0"],
])
def test_a_count_or_port_out_of_range_is_a_usage_error_before_anything_starts(args, tmp_path, monkeypatch):
    """``api --workers -2``, ``worker -c -1`` or ``up -c -1`` handed the number to gunicorn / Celery,
    whose children then died at start (``up`` restarting its workers until it gave up); now a usage
    error naming the option, and nothing is started."""
    started: list = []
    monkeypatch.setattr("app.cli.processes._exec", lambda cmd, env=None: started.append(cmd))
    monkeypatch.setattr("app.cli.stack.Stack.start", lambda self: started.append("stack"))
    monkeypatch.setattr("app.cli.stack.Stack.supervise", lambda self, stop=None, **kw: None)
    monkeypatch.setattr("app.cli.stack.Stack.stop", lambda self: None)
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("MEMEFLOW_DATABASE_URL", "postgresql+psycopg://u@127.0.0.1:1/x")
    monkeypatch.setenv("MEMEFLOW_BROKER_URL", "redis://127.0.0.1:1/0")
    from app.config import reset_settings

    reset_settings(None)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Invalid value" in r.output and args[-2] in r.output, r.output
    assert started == []
