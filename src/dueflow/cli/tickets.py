"""The ``dueflow tickets`` commands: a ticket checked in at the door of its show, as
``POST /api/tickets/{code}/check-in`` and the gate page do it (:mod:`dueflow.service.checkin`),
with an exit status a script switches on.

It takes the error handling and the output consoles from :mod:`dueflow.cli._common`;
:mod:`dueflow.cli` registers its typer app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import accounts, checkin
from dueflow.exceptions import NotFound, TicketCheckedIn, TicketVoid

if TYPE_CHECKING:
    from dueflow.service.deps import Deps

app = typer.Typer(no_args_is_help=True, help="Check tickets in at the door of their show.")

#: The exit status of each verdict of the door (2 is a usage error or bad input, as for every
#: command, and 1 anything else: the database unreachable, the ticket changed meanwhile).
VALID = 0
CHECKED_IN = 3
VOID = 4
UNKNOWN = 5


@app.command("check-in")
def tickets_check_in(
    code: str,
    gate: str | None = typer.Option(
        None, help="The gate's name, kept with the check-in.", callback=one_line
    ),
    user: str = typer.Option(
        ..., "--as", help="Who scans: the show's organizer, or an admin (any show), by name."
    ),
) -> None:
    """Check the ticket CODE in: prints the verdict and exits 0 valid (let in now), 3 checked
    in already (when and at which gate), 4 void (its show or order cancelled), 5 unknown (no
    such ticket, or one of a show USER does not organize), 2 bad input, 1 anything else."""

    async def go(deps: Deps) -> tuple[int, str]:
        scanner = await accounts.get_user(deps, user)
        try:
            ticket = await checkin.check_in(deps, code, user=scanner, gate=gate)
        except TicketCheckedIn as exc:
            return CHECKED_IN, exc.message
        except TicketVoid as exc:
            return VOID, exc.message
        except NotFound as exc:
            return UNKNOWN, f"unknown: {exc.message}"
        return VALID, _valid(ticket)

    status, verdict = run(with_deps(settings_or_exit(), go))
    out.print(verdict, soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(status)


def _valid(ticket: dict[str, Any]) -> str:
    where = f" at gate {ticket['gate']}" if ticket["gate"] else ""
    return (
        f"valid: seat {ticket['seat']} of show {ticket['show_id']} (order {ticket['order_id']}, "
        f"buyer {ticket['buyer']}), checked in at {ticket['checked_in_at']:%Y-%m-%d %H:%M:%S} "
        f"UTC{where}"
    )
