"""Stage providers: pure compute (inputs in, artifact out); no database, no Celery, no Flask.

Use :mod:`app.stages.registry` to obtain a provider by its configured name.
"""
