"""What operators watch: the Prometheus registry every process keeps
(:mod:`~dueflow.metrics.prometheus`) and its exposition at /metrics on a socket of its own
(:mod:`~dueflow.metrics.exposition`, for ``dueflow worker --metrics-port``; ``dueflow serve``
answers /metrics in its API app)."""
