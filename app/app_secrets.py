"""Deployment-wide random secrets kept in the ``app_secrets`` table.

A secret is generated once with :func:`secrets.token_bytes` and inserted if absent; every process
then reads the stored row, so API processes starting at the same moment agree on one value and a
restart keeps it. Nothing here is derived from configuration (a database URL is not a secret).
"""

from __future__ import annotations

import secrets

from sqlalchemy import Engine, text

CURSOR_HMAC = "cursor_hmac"
SECRET_BYTES = 32

# Insert-if-absent, then read: of two racing inserts one wins and both read the winner's value.
INSERT_IF_ABSENT = text("INSERT INTO app_secrets (name, value) VALUES (:name, :value) ON CONFLICT (name) DO NOTHING")
READ_SECRET = text("SELECT value FROM app_secrets WHERE name = :name")


def get_or_create_secret(engine: Engine, name: str) -> bytes:
    """The stored secret ``name``, generating and storing a random one on first use."""
    with engine.connect() as conn:
        value = conn.execute(READ_SECRET, {"name": name}).scalar()
    if value is not None:
        return bytes(value)
    with engine.begin() as conn:
        conn.execute(INSERT_IF_ABSENT, {"name": name, "value": secrets.token_bytes(SECRET_BYTES)})
        return bytes(conn.execute(READ_SECRET, {"name": name}).scalar_one())
