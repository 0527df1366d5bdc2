"""Operator commands given odd but possible input end with a clear message and an exit code, or do
their job — never a traceback, never a half-done run."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from app.cli import main
from app.config import reset_settings
from tests.api.conftest import png_bytes


@pytest.fixture()
def cli(settings):
    reset_settings(settings)
    try:
        yield CliRunner(env={"COLUMNS": "200"})
    finally:
        reset_settings(None)


@pytest.mark.parametrize("duration", ["999999999w", "999999999d", "99999999999s"])
def test_tokens_create_with_a_huge_expiry_is_a_usage_error(cli, engine, duration):
    """``--expires-in 999999999w`` overflowed Python's timedelta and ``999999999d`` PostgreSQL's
    timestamp: both were tracebacks. Now a usage error, and no token is made."""
    from app.auth import create_scope

    create_scope(engine, "alpha")
    r = cli.invoke(main, ["tokens", "create", "alpha", "--name", "ci", "--expires-in", duration])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output and "--expires-in" in r.output, r.output
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_tokens")).scalar_one() == 0


def test_tokens_create_with_a_long_but_representable_expiry_works(cli, engine):
    from app.auth import create_scope

    create_scope(engine, "alpha")
    r = cli.invoke(main, ["tokens", "create", "alpha", "--name", "ci", "--expires-in", "5200w"])
    assert r.exit_code == 0, (r.output, r.exception)


def test_ingest_a_file_whose_name_is_not_utf8(cli, engine, tmp_path):
    """Linux file names are bytes. A file named ``b"caf\\xe9.png"`` (Latin-1) made the whole ingest
    crash with UnicodeEncodeError (its name became the display name), leaving the files after it
    unuploaded; now it is uploaded with a readable display name, and the others too."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    bad = os.fsdecode(os.fsencode(str(inbox)) + b"/caf\xe9.png")
    with open(bad, "wb") as f:
        f.write(png_bytes((10, 20, 30)))
    (inbox / "later.png").write_bytes(png_bytes((40, 50, 60)))
    r = cli.invoke(main, ["ingest", str(inbox)])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "created 2" in r.output, r.output
    with engine.connect() as conn:
        names = sorted(conn.execute(text("SELECT display_name FROM images")).scalars())
    assert names == ["caf\ufffd.png", "later.png"]


@pytest.mark.parametrize("args", [
    ["--maintenance-work-mem", "lots"],
    ["--maintenance-work-mem", "1PB"],
    ["--min-images", "-1"],
])
def test_search_indexes_with_a_bad_option_is_a_usage_error(cli, engine, args):
    """A value PostgreSQL refuses for maintenance_work_mem was a traceback (DataError from
    set_config); a negative --min-images read as "index every scope"."""
    r = cli.invoke(main, ["search-indexes", *args])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output and args[0] in r.output, r.output


def test_search_indexes_with_a_good_work_mem_runs(cli, engine):
    r = cli.invoke(main, ["search-indexes", "--maintenance-work-mem", "64MB"])
    assert r.exit_code == 0, (r.output, r.exception)


def test_ingest_refuses_a_file_over_the_upload_limit_without_reading_it(cli, engine, tmp_path):
    """A multi-gigabyte file named *.png (a disk image, a video) was read whole into memory, hashed
    and copied into a request before the API's 413: memory grew by several times its size. Now its
    size is checked first: reported as payload_too_large, never read; the other files still go in."""
    import resource

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    with open(inbox / "huge.png", "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: no disk used, 300 MiB when read
    (inbox / "ok.png").write_bytes(png_bytes((70, 80, 90)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    r = cli.invoke(main, ["ingest", str(inbox)])
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert r.exit_code == 1, (r.output, r.exception)
    assert "created 1" in r.output and "failed 1" in r.output, r.output
    assert "huge.png" in r.output and "payload_too_large" in r.output, r.output
    assert grown_mib < 150, f"ingest grew by {grown_mib:.0f} MiB for a file it must not read"
