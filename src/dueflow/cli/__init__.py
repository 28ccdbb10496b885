"""The ``dueflow`` program: the typer :data:`app`, :func:`main` (the console entry), and the
command groups registered on it, one module each.

- ``_common.py``: what every group shares (consoles, settings, running a command's coroutine)
- ``serve.py``: ``dueflow serve``; ``server.py`` serves the app and the worker in one process,
  ``supervisor.py`` starts, watches and stops the API processes of ``--workers N``
- ``worker.py``: ``dueflow worker`` and ``dueflow scan``; ``timers.py``: ``dueflow timers``
- ``migrate.py``, ``status.py``, ``simulator.py``, ``demo.py``: the commands of those names
- ``keys.py``: ``dueflow keys`` (service keys)
- ``users.py``, ``goods.py``, ``orders.py``, ``payments.py``, ``refunds.py``, ``shows.py``,
  ``tickets.py`` (the door's check-in) and
  ``shop.py`` (``skus``, ``coupons``, ``flash``), ``webhooks.py``: the groups of those names

A command imports the modules it needs when it runs (:mod:`dueflow.cli._lazy`), so
``dueflow --help`` starts without SQLAlchemy, the API or the providers.
"""

from __future__ import annotations

import typer

from dueflow.cli import (
    demo,
    goods,
    keys,
    migrate,
    orders,
    payments,
    refunds,
    serve,
    shop,
    shows,
    simulator,
    status,
    tickets,
    timers,
    users,
    webhooks,
    worker,
)

#: ``dueflow --help``'s text.
HELP = (
    "The command line: ``dueflow migrate | users | keys | goods | orders | payments | worker | scan | "
    "status | demo``."
)

app: typer.Typer = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)
# typer lists the commands in the order they are registered, then the groups.
app.command()(migrate.migrate)
app.command()(worker.scan)
app.command()(status.status)
app.command()(worker.worker)
app.command()(serve.serve)
app.command()(simulator.simulator)
app.command()(demo.demo)
#: The command groups, by name (``dueflow keys add ...``).
GROUPS: dict[str, typer.Typer] = {
    "users": users.app,
    "keys": keys.app,
    "goods": goods.app,
    "orders": orders.app,
    "payments": payments.app,
    "refunds": refunds.app,
    "timers": timers.app,
    "skus": shop.skus_app,
    "coupons": shop.coupons_app,
    "flash": shop.flash_app,
    "shows": shows.app,
    "tickets": tickets.app,
    "webhooks": webhooks.app,
}
for name, group in GROUPS.items():
    app.add_typer(group, name=name)


def main() -> None:
    """Entry point of the ``dueflow`` program."""
    app()


__all__ = ["app", "main"]
