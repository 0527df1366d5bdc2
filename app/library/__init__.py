"""The library page at ``/``: upload, live progress, search, look-alikes, one image's page (issue 20)."""

from app.library.views import library_bp, register_library

__all__ = ["library_bp", "register_library"]
