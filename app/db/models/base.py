"""The declarative base, its naming convention and the column helpers every model group uses."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, MetaData, String, func
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import DeclarativeBase, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# A scope id: 1..128 chars, no slash, backslash or control characters, not "." or "..".
SCOPE_ID_PATTERN = r"^[^/\\\x01-\x1f\x7f]{1,128}$"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def status_check(column: str, enum: type[StrEnum], name: str | None = None) -> CheckConstraint:
    """The CHECK constraint that keeps ``column`` within ``enum``'s values."""
    values = ", ".join(f"'{m.value}'" for m in enum)
    return CheckConstraint(f"{column} IN ({values})", name=name or f"{column}_valid")


def timestamp_now() -> Any:
    """A ``timestamptz`` column defaulting to the database clock."""
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def uuid_pk() -> Any:
    """A uuid primary key."""
    return mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)


def scope_column() -> Any:
    """The ``scope_id`` column of a tenant table."""
    return mapped_column(String(128), nullable=False)
