"""``dueflow status``: orders, timers, refunds and discrepancies by state, and the invariants."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dueflow.cli._common import out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import render, report

if TYPE_CHECKING:
    from dueflow.service.deps import Deps


def status() -> None:
    """Orders by status, timers by state, overdue and stuck timers, refunds, discrepancies,
    and the invariants."""

    async def go(deps: Deps) -> tuple[report.Snapshot, report.Invariants]:
        return await report.snapshot(deps), await report.check_invariants(deps)

    snapshot, invariants = run(with_deps(settings_or_exit(), go))
    render.print_snapshot(out, snapshot)
    out.print(render.invariants_table(invariants))
