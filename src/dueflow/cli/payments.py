"""``dueflow payments record``: record a payment received off-line (the manual provider)."""

from __future__ import annotations

import typer

from dueflow.cli._common import err, one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import payments

app = typer.Typer(no_args_is_help=True, help="Record payments.")


@app.command("record")
def payments_record(
    order_id: int,
    amount: str = typer.Option(..., help="Yuan received, like 12.50; must equal the order's."),
    reference: str | None = typer.Option(
        None, help="Bank or receipt reference.", callback=one_line
    ),
) -> None:
    """Record a payment received off-line (the manual provider)."""
    pay_no, outcome = run(
        with_deps(
            settings_or_exit(),
            lambda d: payments.record_manual_payment(
                d, order_id=order_id, amount=amount, reference=reference
            ),
        )
    )
    if outcome is payments.PaymentOutcome.REFUND:
        err.print(
            f"[yellow]order {order_id} no longer awaits payment: payment {pay_no} is recorded "
            "as a discrepancy and a refund awaits review[/yellow]"
        )
        raise typer.Exit(1)
    out.print(f"payment {pay_no} recorded: order {order_id} {outcome.value}")
