"""``dueflow refunds``: list refunds and review them (approve, retry, reject, settle off-line)."""

from __future__ import annotations

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import refunds, render

app = typer.Typer(
    no_args_is_help=True, help="Review refunds: approve, retry, reject, settle off-line."
)


@app.command("list")
def refunds_list(
    state: str | None = typer.Option(None, help="Only refunds in this state."),
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many, newest first."),
) -> None:
    """Refunds, newest first."""
    rows = run(
        with_deps(settings_or_exit(), lambda d: refunds.list_refunds(d, state=state, limit=limit))
    )
    columns = {
        "id": "id",
        "refund no": "refund_no",
        "order": "order_id",
        "provider": "provider",
        "amount": "amount",
        "reason": "reason",
        "state": "state",
        "error": "last_error",
    }
    out.print(render.table_of(rows, columns))


@app.command("approve")
def refunds_approve(refund_id: int) -> None:
    """Approve a refund in review: it goes to the provider."""
    state = run(with_deps(settings_or_exit(), lambda d: refunds.approve(d, refund_id)))
    out.print(f"refund {refund_id} {state}")


@app.command("retry")
def refunds_retry(refund_id: int) -> None:
    """Retry a failed refund with the same refund number."""
    state = run(with_deps(settings_or_exit(), lambda d: refunds.retry(d, refund_id)))
    out.print(f"refund {refund_id} {state}")


@app.command("reject")
def refunds_reject(
    refund_id: int,
    reason: str = typer.Option(
        ..., help="Why (1-200 characters): no money goes back.", callback=one_line
    ),
) -> None:
    """Reject a refund in review or failed, with a reason (final)."""
    state = run(
        with_deps(settings_or_exit(), lambda d: refunds.reject(d, refund_id, reason=reason))
    )
    out.print(f"refund {refund_id} {state}")


@app.command("settle-offline")
def refunds_settle_offline(
    refund_id: int,
    reference: str = typer.Option(
        ...,
        help="The bank transfer's (or receipt's) reference, 1-200 characters.",
        callback=one_line,
    ),
) -> None:
    """Record a refund in review or failed as paid back outside dueflow (final)."""
    state = run(
        with_deps(
            settings_or_exit(), lambda d: refunds.settle_offline(d, refund_id, reference=reference)
        )
    )
    out.print(f"refund {refund_id} {state}")
