"""``python -m app.cli`` runs the ``memeflow`` command."""

from app.cli import main

main()
