"""Short-lived named locks, one module per backend behind the port in :mod:`~dueflow.locks.base`
(with :func:`~dueflow.locks.base.held` and the no-op adapter used without Redis); Redis in
:mod:`~dueflow.locks.redis`. An optimisation, never the guard: the database decides every race."""
