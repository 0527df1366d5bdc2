"""Celery runtime: the app and its thin tasks (hints are published by :mod:`app.publisher`)."""
