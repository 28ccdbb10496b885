"""``dueflow status``: orders, timers, refunds and discrepancies by state, what needs attention,
and the invariants over the latest changes (``--full``: over every order)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dueflow.cli._common import out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import render, report

if TYPE_CHECKING:
    from dueflow.service.deps import Deps


def status(
    full: bool = typer.Option(
        False,
        "--full",
        help="Check the invariants over every order (seconds on a large database), not over "
        "the latest changes.",
    ),
) -> None:
    """Orders by status, timers by state, overdue and stuck timers, refunds, discrepancies,
    what needs attention, and the invariants (over the latest changes; --full: every order)."""

    async def go(deps: Deps) -> tuple[report.Snapshot, report.Checked]:
        # The dashboard's reads, side by side on PostgreSQL and MariaDB (service/reads.py).
        if full:
            return await report.snapshot(deps, full=True), await report.check_full(deps)
        return await report.snapshot_and_check(deps)

    snapshot, checked = run(with_deps(settings_or_exit(), go))
    render.print_snapshot(out, snapshot)
    out.print(render.invariants_table(checked.invariants))
    if checked.full:
        out.print(f"invariants checked over every order ({checked.orders})")
    else:
        since = "" if checked.since is None else f", since {checked.since:%Y-%m-%d %H:%M:%S} UTC"
        out.print(
            f"invariants checked over the last {checked.orders} changes{since} "
            "(and every live order for the deadlines); every order: dueflow status --full"
        )
