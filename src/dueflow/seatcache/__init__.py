"""The seat-state cache, one module per backend behind the port in :mod:`~dueflow.seatcache.base`:
none (the database is read) there, Redis in :mod:`~dueflow.seatcache.redis`. A copy for the seat
map and a pre-check, never the truth: the database decides every sale."""
