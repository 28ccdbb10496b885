"""``dueflow timers run-again``: run a parked timer again."""

from __future__ import annotations

import typer

from dueflow.cli._common import out, run, settings_or_exit, with_deps

app = typer.Typer(no_args_is_help=True, help="Run timers again.")


@app.command("run-again")
def timers_run_again(timer_id: int) -> None:
    """Run a parked timer again once its cause is fixed (or one past its deadline, now)."""
    from dueflow.service import operations

    timer = run(
        with_deps(settings_or_exit(), lambda d: operations.run_timer_now(d, timer_id, actor="cli"))
    )
    out.print(f"timer {timer_id} {timer['state']}, due now: a worker runs it within a second")
