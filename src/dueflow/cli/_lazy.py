"""The modules the commands use, each imported when a command first uses one of its names, not
when ``dueflow`` starts: SQLAlchemy, the API, the payment providers and the timer backends take
seconds to import, and ``dueflow --help`` needs none of them (``tests/e2e/test_cli.py`` keeps
``import dueflow.cli`` free of SQLAlchemy and FastAPI). A command module imports them from here
(``from dueflow.cli._lazy import accounts``); type checkers see the real modules."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class LazyModule:
    """A module imported when a command first uses one of its names."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    from dueflow import bootstrap, render
    from dueflow.service import (
        accounts,
        checkin,
        events,
        orders,
        payments,
        refunds,
        report,
        shop,
        shop_overview,
        tickets,
        webhook_endpoints,
        webhooks,
    )
    from dueflow.service import keys as service_keys
    from dueflow.store import migrate as migrations
    from dueflow.store import shows as show_states
    from dueflow.worker import reconciler
else:
    bootstrap = LazyModule("dueflow.bootstrap")
    render = LazyModule("dueflow.render")
    accounts = LazyModule("dueflow.service.accounts")
    checkin = LazyModule("dueflow.service.checkin")
    events = LazyModule("dueflow.service.events")
    orders = LazyModule("dueflow.service.orders")
    payments = LazyModule("dueflow.service.payments")
    refunds = LazyModule("dueflow.service.refunds")
    report = LazyModule("dueflow.service.report")
    shop = LazyModule("dueflow.service.shop")
    shop_overview = LazyModule("dueflow.service.shop_overview")
    tickets = LazyModule("dueflow.service.tickets")
    service_keys = LazyModule("dueflow.service.keys")
    webhook_endpoints = LazyModule("dueflow.service.webhook_endpoints")
    webhooks = LazyModule("dueflow.service.webhooks")
    migrations = LazyModule("dueflow.store.migrate")
    show_states = LazyModule("dueflow.store.shows")
    reconciler = LazyModule("dueflow.worker.reconciler")

__all__ = [
    "LazyModule",
    "accounts",
    "bootstrap",
    "checkin",
    "events",
    "migrations",
    "orders",
    "payments",
    "reconciler",
    "refunds",
    "render",
    "report",
    "service_keys",
    "shop",
    "shop_overview",
    "show_states",
    "tickets",
    "webhook_endpoints",
    "webhooks",
]
