"""Prometheus metrics, in a registry of dueflow's own (built per process, never at import).

Names follow Prometheus' conventions: base units in the name (``_seconds``), counters end in
``_total``, gauges and histograms of counts carry no suffix. ``dueflow serve`` and
``dueflow worker --metrics-port`` expose the same registry at /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import event

if TYPE_CHECKING:
    from dueflow.store.db import Database

LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900)
#: A handler's time over its share of a batch: milliseconds of database work up to a
#: provider's timeout.
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: What a worker asks of its trigger: arm (publish), wait (claim), ack, feed.
TRIGGER_OPERATIONS = ("arm", "wait", "ack", "feed")
#: What the seat cache is asked to do (errors are counted by operation).
SEAT_CACHE_OPERATIONS = ("moved", "states", "taken", "load")
#: Timers claimed per batch: one delivered id up to the largest ``max_batch_size``.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Readings(Protocol):
    """What the gauges read from the database are set from (a
    :class:`dueflow.service.report.Snapshot`, which metrics need not import: the use cases
    import metrics, never the other way)."""

    @property
    def orders(self) -> Mapping[str, int]: ...
    @property
    def timers(self) -> Mapping[str, int]: ...
    @property
    def overdue(self) -> int: ...
    @property
    def stuck(self) -> int: ...
    @property
    def refunds(self) -> Mapping[str, int]: ...
    @property
    def discrepancies(self) -> int: ...
    @property
    def event_backlog(self) -> int: ...
    @property
    def refund_processing_seconds(self) -> float: ...
    @property
    def attention(self) -> Mapping[str, int]: ...


class Metrics:
    """What operators watch: timer lateness, outcomes, handler time and batch sizes, trigger
    errors, the scanner's finds, notifications, alarms, HTTP latency, locks skipped, seat
    cache repairs and errors, SQL statements sent."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lateness = Histogram(
            "dueflow_timer_lateness_seconds",
            "From a timer's deadline to the moment a worker took it, first attempts only.",
            ["kind"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.fired = Counter(
            "dueflow_timers_fired_total",
            "Timers run, by kind and result.",
            ["kind", "result"],
            registry=r,
        )
        self.notifications = Counter(
            "dueflow_notifications_total",
            "Provider notifications, by provider and outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.http_latency = Histogram(
            "dueflow_http_request_duration_seconds",
            "HTTP request latency.",
            ["method", "route", "status"],
            registry=r,
        )
        self.overdue = Gauge(
            "dueflow_timers_overdue", "Live timers past due by the grace.", registry=r
        )
        self.stuck = Gauge("dueflow_timers_stuck", "Live timers flagged stuck.", registry=r)
        self.parked = Gauge(
            "dueflow_timers_parked",
            "Timers parked after their last attempt failed; they wait for an operator.",
            registry=r,
        )
        self.discrepancies = Gauge("dueflow_discrepancies", "Recorded discrepancies.", registry=r)
        self.refunds = Gauge("dueflow_refunds", "Refunds by state.", ["state"], registry=r)
        self.refund_processing = Gauge(
            "dueflow_refund_processing_oldest_seconds",
            "How long the longest-processing refund has been processing (0: none is).",
            registry=r,
        )
        self.orders = Gauge("dueflow_orders", "Orders by status.", ["status"], registry=r)
        self.attention = Gauge(
            "dueflow_needs_attention",
            "What waits for a person, by kind: parked_timer, refund_failed, refund_stuck "
            "(processing over an hour), discrepancy (its refund awaits review); the dashboard's "
            "Needs attention list.",
            ["kind"],
            registry=r,
        )
        self.lock_bypassed = Counter(
            "dueflow_lock_bypassed_total",
            "Goods and order locks skipped because Redis was unreachable (the database decided).",
            registry=r,
        )
        self.db_statements = Counter(
            "dueflow_db_statements_total",
            "SQL statements sent to the database (every statement a cursor executes, BEGIN "
            "included where dueflow issues it, COMMIT not), by dialect.",
            ["dialect"],
            registry=r,
        )
        self._timer_metrics(r)
        self._scanner_metrics(r)
        self._event_metrics(r)
        self._seat_cache_metrics(r)

    def _timer_metrics(self, r: CollectorRegistry) -> None:
        self.handler_duration = Histogram(
            "dueflow_timer_handler_duration_seconds",
            "Time a kind's handler took over its share of one batch.",
            ["kind"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "dueflow_timer_batch_size",
            "Timers claimed per batch (claim loop, delivered ids and scanner alike).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.trigger_errors = Counter(
            "dueflow_trigger_errors_total",
            "Trigger operations that failed (arm, wait, ack, feed); the scanner covers their timers.",
            ["trigger", "operation"],
            registry=r,
        )

    def _scanner_metrics(self, r: CollectorRegistry) -> None:
        self.scanner_passes = Counter(
            "dueflow_scanner_passes_total", "Scanner passes run.", registry=r
        )
        self.scanner_claimed = Counter(
            "dueflow_scanner_claimed_total",
            "Timers the scanner claimed: missed by the trigger or left by a stopped worker.",
            registry=r,
        )
        self.scanner_errors = Counter(
            "dueflow_scanner_errors_total",
            "Scanner passes ended early because the timers could not be claimed.",
            registry=r,
        )

    def watch_trigger(self, trigger: str) -> None:
        """Expose the ``trigger``'s error counters at 0 from the start, so the first error is an
        increase (a series born at 1 looks flat to ``rate`` and ``increase``)."""
        for operation in TRIGGER_OPERATIONS:
            self.trigger_errors.labels(trigger, operation)

    def _event_metrics(self, r: CollectorRegistry) -> None:
        self.events_backlog = Gauge(
            "dueflow_events_backlog",
            "Order events the events webhook has not delivered yet (0 without a webhook).",
            registry=r,
        )
        self.event_deliveries = Counter(
            "dueflow_event_deliveries_total",
            "Events webhook deliveries by outcome: delivered, replayed (an operator's replay) "
            "or failed (tried again with backoff).",
            ["outcome"],
            registry=r,
        )

    def _seat_cache_metrics(self, r: CollectorRegistry) -> None:
        self.seat_cache_repairs = Counter(
            "dueflow_seat_cache_repairs_total",
            "Seats whose state the reconciler found wrong in the seat cache and set right.",
            registry=r,
        )
        self.seat_cache_errors = Counter(
            "dueflow_seat_cache_errors_total",
            "Seat cache operations that failed or were skipped while Redis was unreachable "
            "(reads went to the database; lost moves are repaired by the reconciler).",
            ["operation"],
            registry=r,
        )
        for operation in SEAT_CACHE_OPERATIONS:
            self.seat_cache_errors.labels(operation)

    def count_statements(self, db: Database) -> None:
        """Count every statement sent through ``db``'s engines in ``dueflow_db_statements_total``
        (statements per request and per batch, read off /metrics)."""
        counter = self.db_statements.labels(db.dialect)

        def sent(*_args: object) -> None:
            counter.inc()

        for engine in {db.engine, db.report_engine}:
            event.listen(engine.sync_engine, "before_cursor_execute", sent)

    def trigger_failed(self, trigger: str, operation: str) -> None:
        """One ``operation`` of the ``trigger`` (its URL scheme) failed."""
        self.trigger_errors.labels(trigger, operation).inc()

    def record_snapshot(self, snapshot: Readings) -> None:
        """Set the gauges read from the database (each scrape takes a fresh snapshot)."""
        self.overdue.set(snapshot.overdue)
        self.stuck.set(snapshot.stuck)
        self.parked.set(snapshot.timers.get("parked", 0))
        self.discrepancies.set(snapshot.discrepancies)
        # A state or status left by its last refund or order is dropped, not kept at its count.
        self.refunds.clear()
        self.orders.clear()
        for state, count in snapshot.refunds.items():
            self.refunds.labels(state).set(count)
        for status, count in snapshot.orders.items():
            self.orders.labels(status).set(count)
        self.events_backlog.set(snapshot.event_backlog)
        self.refund_processing.set(snapshot.refund_processing_seconds)
        for kind, count in snapshot.attention.items():
            self.attention.labels(kind).set(count)

    def claimed(self, kind: str, deadlines: Sequence[tuple[datetime, int]], now: datetime) -> None:
        """A worker took timers of ``kind``: (deadline, attempts) each."""
        lateness = self.lateness.labels(kind)  # once a batch: labels() costs 20 us a call
        for deadline, attempts in deadlines:
            if attempts == 1:
                lateness.observe(max(0.0, (now - deadline).total_seconds()))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
