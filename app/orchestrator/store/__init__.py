"""Every SQL statement that claims, fences or transitions state, split by entity.

Each transition is one named module-level statement and one ``@transition`` function that runs
it (``_sql.py``; the list is docs/architecture.md's transition table). Functions ending in
``_txn`` run inside the caller's transaction (a SQLAlchemy Connection with a transaction begun);
they never commit. A transition returns an ``Outcome``: a fenced write that matches zero rows is
``matched=False``, which the caller turns into a logged, counted fencing rejection (or a lost
race / nothing to do — the caller says which).
"""
