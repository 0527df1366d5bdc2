"""The /ops page: a server-rendered view of the database truth for operators (SPEC §7)."""

from app.ops.views import ops_bp, register_ops

__all__ = ["ops_bp", "register_ops"]
