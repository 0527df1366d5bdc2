"""Every SQL statement that claims, fences or transitions state, split by entity.

Functions ending in ``_txn`` run inside the caller's transaction (a SQLAlchemy Connection with a
transaction begun); they never commit. A fenced write that matches zero rows returns a falsy
outcome that the service layer turns into a logged, counted fencing rejection.
"""
