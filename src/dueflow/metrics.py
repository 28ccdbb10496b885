"""Prometheus metrics, in a registry of dueflow's own (built per process, never at import)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900)


class Metrics:
    """What operators watch: timer lateness and outcomes, notifications, alarms, HTTP latency,
    locks skipped."""

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
            "dueflow_http_request_seconds",
            "HTTP request latency.",
            ["method", "route", "status"],
            registry=r,
        )
        self.overdue = Gauge(
            "dueflow_timers_overdue", "Live timers past due by the grace.", registry=r
        )
        self.stuck = Gauge("dueflow_timers_stuck", "Live timers flagged stuck.", registry=r)
        self.discrepancies = Gauge("dueflow_discrepancies", "Recorded discrepancies.", registry=r)
        self.refunds = Gauge("dueflow_refunds", "Refunds by state.", ["state"], registry=r)
        self.orders = Gauge("dueflow_orders", "Orders by status.", ["status"], registry=r)
        self.lock_bypassed = Counter(
            "dueflow_lock_bypassed",
            "Goods and order locks skipped because Redis was unreachable (the database decided).",
            registry=r,
        )

    def claimed(self, kind: str, deadlines: Sequence[tuple[datetime, int]], now: datetime) -> None:
        """A worker took timers of ``kind``: (deadline, attempts) each."""
        for deadline, attempts in deadlines:
            if attempts == 1:
                self.lateness.labels(kind).observe(max(0.0, (now - deadline).total_seconds()))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
