"""The memeflow Celery app, configured from the top-level ``celeryconfig`` module.

Start a worker with ``celery -A app.worker.celery_app worker -Q visual`` (or ``memeflow worker
--lane visual``). Importing this module never touches the database or starts a server.
"""

from __future__ import annotations

import sys
from pathlib import Path

from celery import Celery

try:
    import celeryconfig  # noqa: F401 - installed as a top-level module (setup.cfg py_modules)
except ImportError:  # running from a source checkout whose root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

celery_app = Celery("memeflow")
celery_app.config_from_object("celeryconfig")
celery_app.conf.imports = ("app.worker.tasks",)
celery = celery_app  # `celery -A app.worker.celery_app` looks for `app` or `celery`

from app.publisher import celery_app_for  # noqa: E402, F401 - moved to app.publisher; kept for merges
from app.worker import tasks as _tasks  # noqa: F401, E402 - registers the tasks on import
