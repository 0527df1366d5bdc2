"""The ``memeflow`` command line. Each command group lives in its own module."""

from __future__ import annotations

import os
import re

import click

from app.cli import db as _db
from app.cli import processes as _processes
from app.cli import services as _services
from app.cli.safe_text import printable


class _Main(click.Group):
    """The root group: refuses command-line arguments that are not text before any command runs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if _SURROGATE.search(arg) and not _a_path(arg):
                # bytes that are not UTF-8 reach sys.argv as lone surrogates (surrogateescape): fine in a
                # file name (the OS takes bytes), refused by the database driver and the terminal
                # everywhere else — a usage error, not a traceback
                raise click.UsageError(f"argument '{_shown(arg)}' is not valid UTF-8 text (check the terminal's "
                                       "encoding)", ctx)
        return super().parse_args(ctx, args)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _a_path(arg: str) -> bool:
    """Whether ``arg`` (or the value of ``--option=value``) names a file or directory that exists,
    or a new one in a directory that does, named with a '/' (``beat --schedule var/<new file>``):
    Linux file names are bytes, so those may be any."""
    value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
    parent = os.path.dirname(value)
    return os.path.lexists(value) or (parent != "" and os.path.isdir(parent))


def _shown(arg: str) -> str:
    """``arg`` with its undecodable bytes as ``\\xNN`` (other lone surrogates as ``\\udNNN``)."""
    try:
        raw = arg.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = arg.encode("utf-8", "backslashreplace")
    return printable(raw.decode("utf-8", "backslashreplace"), max_len=200)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memeflow")
def main() -> None:
    """memeflow: images in, searchable knowledge out (PostgreSQL decides, Celery hints)."""


main.add_command(_db.db)
main.add_command(_services.up)
main.add_command(_services.services_status)
main.add_command(_services.services_stop)
main.add_command(_processes.api)
main.add_command(_processes.worker)
main.add_command(_processes.beat)
main.add_command(_processes.flower)

from app.cli import admin as _admin
from app.cli import demo as _demo
from app.cli import ingest as _ingest

main.add_command(_demo.demo)
main.add_command(_ingest.ingest)
main.add_command(_admin.scopes)
main.add_command(_admin.tokens)

from app.cli import batch as _batch
from app.cli import maintenance as _maintenance
from app.cli import search as _search
from app.cli import search_model as _search_model
from app.cli import status as _status

main.add_command(_status.status)
main.add_command(_search.search)
main.add_command(_search_model.search_model)
main.add_command(_maintenance.sweep)
main.add_command(_maintenance.gc)
main.add_command(_maintenance.search_indexes)
main.add_command(_batch.process_all)
