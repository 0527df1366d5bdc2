"""Celery runtime: the app, thin tasks, and the hint publisher over the broker."""
