"""The command line: ``dueflow migrate | users | goods | orders | payments | worker | scan | status | demo``."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from dueflow.cli import shop as cli_shop
from dueflow.cli import shows as cli_shows
from dueflow.cli._common import (
    LazyModule,
    configure_logging,
    err,
    multiline,
    one_line,
    out,
    run,
    settings_or_exit,
    with_deps,
)

if TYPE_CHECKING:
    from dueflow import bootstrap, render
    from dueflow.service import accounts, events, orders, payments, refunds, report
    from dueflow.service.deps import Deps
    from dueflow.store import migrate as migrations
    from dueflow.worker import reconciler
else:
    bootstrap = LazyModule("dueflow.bootstrap")
    render = LazyModule("dueflow.render")
    accounts = LazyModule("dueflow.service.accounts")
    events = LazyModule("dueflow.service.events")
    orders = LazyModule("dueflow.service.orders")
    payments = LazyModule("dueflow.service.payments")
    refunds = LazyModule("dueflow.service.refunds")
    report = LazyModule("dueflow.service.report")
    migrations = LazyModule("dueflow.store.migrate")
    reconciler = LazyModule("dueflow.worker.reconciler")

app: typer.Typer = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
users_app = typer.Typer(no_args_is_help=True, help="Manage users.")
goods_app = typer.Typer(no_args_is_help=True, help="Put goods on sale.")
orders_app = typer.Typer(no_args_is_help=True, help="Place and inspect orders.")
payments_app = typer.Typer(no_args_is_help=True, help="Record payments.")
refunds_app = typer.Typer(
    no_args_is_help=True, help="Review refunds: approve, retry, reject, settle off-line."
)
app.add_typer(users_app, name="users")
app.add_typer(goods_app, name="goods")
app.add_typer(orders_app, name="orders")
app.add_typer(payments_app, name="payments")
app.add_typer(refunds_app, name="refunds")
timers_app = typer.Typer(no_args_is_help=True, help="Run timers again.")
app.add_typer(timers_app, name="timers")
app.add_typer(cli_shop.skus_app, name="skus")
app.add_typer(cli_shop.coupons_app, name="coupons")
app.add_typer(cli_shop.flash_app, name="flash")
app.add_typer(cli_shows.app, name="shows")


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema."""
    from dueflow.store.db import Database

    settings = settings_or_exit()

    async def go() -> None:
        db = Database.from_url(
            settings.database_url, sqlite_synchronous=settings.sqlite_synchronous
        )
        try:
            await migrations.upgrade(db)
        finally:
            await db.dispose()

    run(go())
    out.print(f"database at {settings.database_url} is up to date")


@users_app.command("add")
def users_add(
    name: str = typer.Argument(..., callback=one_line),
    admin: bool = typer.Option(False, "--admin", help="Make an admin."),
) -> None:
    """Create a user and print its bearer token (shown once)."""
    user, token = run(
        with_deps(settings_or_exit(), lambda d: accounts.add_user(d, name, admin=admin))
    )
    role = "admin" if user.is_admin else "user"
    out.print(f"{role} {user.name} (id {user.id}) token: {token}", soft_wrap=True)


@goods_app.command("add")
def goods_add(
    seller: str = typer.Option(..., help="The selling user's name."),
    title: str = typer.Option(..., callback=one_line),
    price: str = typer.Option(..., help="Yuan, like 12.50."),
) -> None:
    """Put goods on sale for a seller."""

    async def go(deps: Deps) -> int:
        user = await accounts.get_user(deps, seller)
        return await accounts.add_goods(deps, seller_id=user.id, title=title, price=price)

    async def added(deps: Deps) -> dict[str, Any]:
        return await accounts.get_goods(deps, await go(deps))

    item = run(with_deps(settings_or_exit(), added))
    out.print(f"goods {item['id']} on sale: {item['title']} for {item['price']}")


@orders_app.command("place")
def orders_place(
    goods_id: int | None = typer.Argument(None, help="The goods to hold (or --show and --seats)."),
    buyer: str = typer.Option(..., help="The buying user's name."),
    show_id: int | None = typer.Option(None, "--show", help="The show whose seats to hold."),
    seats: str | None = typer.Option(None, help="With --show: seat labels, like A-1,A-2."),
    sku: str | None = typer.Option(None, help="SKU units, like 3x2,5x1 (a ``shop`` order)."),
    coupon: int | None = typer.Option(None, help="With --sku: the buyer's coupon to use."),
    flash: int | None = typer.Option(None, help="A flash sale to buy at (a ``flash`` order)."),
    quantity: int | None = typer.Option(None, help="With --flash: units to buy (1)."),
) -> None:
    """Place an order holding the goods, the seats of a show (a ``ticket`` order), units of
    SKUs and a coupon (``shop``), or units of a flash sale (``flash``)."""
    if any(v is not None for v in (sku, coupon, flash, quantity)):
        if goods_id is not None or show_id is not None or seats is not None:
            raise typer.BadParameter("give goods, --show and --seats, --sku or --flash: one")
        cli_shop.place_units(buyer, sku=sku, coupon=coupon, flash=flash, quantity=quantity)
        return
    if (goods_id is None) == (show_id is None) or (show_id is None) != (seats is None):
        raise typer.BadParameter("give a goods id, --show with --seats, --sku or --flash")
    if show_id is not None and seats is not None:
        cli_shows.place_seats(show_id, seats, buyer)
        return
    goods: int = goods_id  # type: ignore[assignment]  # not None: checked above

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, buyer)
        order_id = await orders.place_order(deps, buyer_id=user.id, goods_id=goods)
        return await orders.order_view(deps, order_id)

    view = run(with_deps(settings_or_exit(), go))
    out.print(
        f"order {view['id']} {view['status']}: {view['amount']} due by "
        f"{view['pay_deadline']:%Y-%m-%d %H:%M:%S} UTC"
    )


def _act(name: str, action: Callable[[Deps, int], Awaitable[Any]]) -> None:
    async def go(deps: Deps) -> str:
        user = await accounts.get_user(deps, name)
        await action(deps, user.id)
        return "ok"

    run(with_deps(settings_or_exit(), go))


@orders_app.command("cancel")
def orders_cancel(
    order_id: int, user: str = typer.Option(..., "--as", help="Buyer or seller name.")
) -> None:
    """Cancel an order: the buyer before paying, the seller before shipping."""

    async def cancel(deps: Deps, user_id: int) -> None:
        order = await orders.order_view(deps, order_id)
        if order["seller_id"] == user_id:
            await orders.cancel_by_seller(deps, order_id=order_id, user_id=user_id)
        else:
            await orders.cancel_by_buyer(deps, order_id=order_id, user_id=user_id)

    _act(user, cancel)
    out.print(f"order {order_id} cancelled")


@orders_app.command("ship")
def orders_ship(
    order_id: int,
    user: str = typer.Option(..., "--as", help="The seller's name."),
    carrier: str = typer.Option(..., callback=one_line),
    tracking_no: str = typer.Option(..., "--tracking-no", callback=one_line),
) -> None:
    """The seller ships an order."""
    _act(
        user,
        lambda d, uid: orders.ship(
            d, order_id=order_id, user_id=uid, carrier=carrier, tracking_no=tracking_no
        ),
    )
    out.print(f"order {order_id} shipped with {carrier} {tracking_no}")


@orders_app.command("confirm")
def orders_confirm(
    order_id: int, user: str = typer.Option(..., "--as", help="The buyer's name.")
) -> None:
    """The buyer confirms receipt."""
    _act(user, lambda d, uid: orders.confirm_receipt(d, order_id=order_id, user_id=uid))
    out.print(f"order {order_id} received")


@orders_app.command("review")
def orders_review(
    order_id: int,
    user: str = typer.Option(..., "--as", help="Buyer or seller name."),
    rating: int = typer.Option(..., min=1, max=5),
    comment: str = typer.Option("", callback=multiline),
) -> None:
    """The buyer or the seller reviews a received order."""
    _act(
        user,
        lambda d, uid: orders.review(
            d, order_id=order_id, user_id=uid, rating=rating, comment=comment
        ),
    )
    out.print(f"order {order_id} reviewed by {user}")


@orders_app.command("show")
def orders_show(order_id: int) -> None:
    """Show an order with its timers and timeline."""
    view = run(with_deps(settings_or_exit(), lambda d: orders.order_view(d, order_id)))
    render.print_order(out, view)


@payments_app.command("record")
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


@refunds_app.command("list")
def refunds_list(
    state: str | None = typer.Option(None, help="Only refunds in this state."),
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many, newest first."),
) -> None:
    """Refunds, newest first."""
    rows = run(
        with_deps(settings_or_exit(), lambda d: refunds.list_refunds(d, state=state, limit=limit))
    )
    table = Table("id", "refund no", "order", "provider", "amount", "reason", "state", "error")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["refund_no"],
            str(r["order_id"]),
            r["provider"],
            str(r["amount"]),
            r["reason"],
            r["state"],
            r["last_error"] or "",
        )
    out.print(table)


@refunds_app.command("approve")
def refunds_approve(refund_id: int) -> None:
    """Approve a refund in review: it goes to the provider."""
    state = run(with_deps(settings_or_exit(), lambda d: refunds.approve(d, refund_id)))
    out.print(f"refund {refund_id} {state}")


@refunds_app.command("retry")
def refunds_retry(refund_id: int) -> None:
    """Retry a failed refund with the same refund number."""
    state = run(with_deps(settings_or_exit(), lambda d: refunds.retry(d, refund_id)))
    out.print(f"refund {refund_id} {state}")


@refunds_app.command("reject")
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


@refunds_app.command("settle-offline")
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


@timers_app.command("run-again")
def timers_run_again(timer_id: int) -> None:
    """Run a parked timer again once its cause is fixed (or one past its deadline, now)."""
    from dueflow.service import operations

    timer = run(
        with_deps(settings_or_exit(), lambda d: operations.run_timer_now(d, timer_id, actor="cli"))
    )
    out.print(f"timer {timer_id} {timer['state']}, due now: a worker runs it within a second")


@app.command()
def scan() -> None:
    """Run one scanner pass: fire timers the trigger missed and claims whose lease expired."""
    from dueflow.worker.runner import Worker
    from dueflow.worker.scanner import scan_once

    async def go(deps: Deps) -> Any:
        return await scan_once(Worker(deps))

    result = run(with_deps(settings_or_exit(), go))
    out.print(
        f"scan: claimed {result.claimed} timers in {result.batches} batches, "
        f"{result.failed_batches} failed, {result.errors} errors, {result.seconds * 1000:.1f} ms"
    )


@app.command()
def status() -> None:
    """Orders by status, timers by state, overdue and stuck timers, refunds, discrepancies,
    and the invariants."""

    async def go(deps: Deps) -> tuple[report.Snapshot, report.Invariants]:
        return await report.snapshot(deps), await report.check_invariants(deps)

    snapshot, invariants = run(with_deps(settings_or_exit(), go))
    render.print_snapshot(out, snapshot)
    out.print(render.invariants_table(invariants))


@app.command()
def worker(
    concurrency: int = typer.Option(1, min=1, max=64, help="Concurrent claim loops."),
    no_scanner: bool = typer.Option(False, "--no-scanner", help="Do not run the scanner here."),
    metrics_port: int | None = typer.Option(
        None, min=0, max=65535, help="Serve /metrics on this TCP port (0: any free one)."
    ),
    metrics_host: str = typer.Option("127.0.0.1", help="Interface /metrics listens on."),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Run timers as they come due, and the scanner, until SIGINT or SIGTERM."""
    from dueflow.metrics import exposition
    from dueflow.worker.runner import Worker, run_feeder
    from dueflow.worker.scanner import run_scanner

    settings = settings_or_exit()
    configure_logging(verbose, settings)

    async def go(deps: Deps) -> None:
        await migrations.require_head(deps.db)  # exits 2 over a schema not migrated
        sock = None if metrics_port is None else exposition.listen(metrics_host, metrics_port)

        async def refresh_gauges() -> None:
            deps.metrics.record_snapshot(await report.snapshot(deps))

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def shut_down() -> None:
            stop.set()
            deps.trigger.wake()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, shut_down)
        runner = Worker(deps)
        tasks = [asyncio.create_task(runner.run(stop)) for _ in range(concurrency)]
        if not no_scanner:
            tasks.append(asyncio.create_task(run_scanner(runner, stop)))
            tasks += reconciler.start(deps, stop)
        tasks.append(asyncio.create_task(run_feeder(runner, stop)))
        tasks += events.start(deps, bootstrap.build_event_webhook(settings), stop)
        if sock is not None:
            scrape = exposition.metrics_app(deps.metrics, refresh_gauges)
            tasks.append(asyncio.create_task(exposition.serve_metrics(scrape, sock, stop)))
            err.print(f"metrics on http://{metrics_host}:{sock.getsockname()[1]}/metrics")
        err.print(f"worker {runner.name} running ({concurrency} loops); Ctrl-C stops")
        await asyncio.gather(*tasks)
        err.print(f"worker stopped after {runner.stats.claimed} timers")

    run(with_deps(settings, go))


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
    workers: int = typer.Option(
        1,
        min=1,
        max=64,
        help="API processes sharing the port (PostgreSQL and MySQL; SQLite serves one). The "
        "worker still runs once, in the process that starts them.",
    ),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve HTTP only."),
    dev_users: bool = typer.Option(
        False,
        "--dev-users",
        help="Print fresh tokens for users admin (an admin), alice and bob, creating them if "
        "missing (their earlier tokens stop working).",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Serve the HTTP app (on uvloop and httptools) with the worker, the scanner and the feeder.
    In the dev profile with no provider configured, the payment simulator is mounted at /sim
    and its keys are handed to dueflow's settings."""
    from dueflow import server

    settings = settings_or_exit()
    configure_logging(verbose, settings)
    run(
        server.serve(
            settings,
            host=host,
            port=port,
            worker=not no_worker,
            dev_users=dev_users,
            workers=workers,
            verbose=verbose,
            console=err,
        ),
        loop_factory=server.new_event_loop,
    )


@app.command()
def simulator(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8090, min=1, max=65535, help="TCP port."),
    time_scale: float = typer.Option(
        1.0, min=0.001, help="Divide the providers' notification retry delays by this."
    ),
) -> None:
    """Serve a local Alipay and WeChat Pay v3 simulator (fresh keys each start; GET
    /control/keys tells a client what it needs)."""
    from dueflow.payments.simulator import SimulatorConfig
    from dueflow.payments.simulator.app import serve

    config = SimulatorConfig.generate(time_scale=time_scale)
    err.print(f"simulator on http://{host}:{port} (keys: http://{host}:{port}/control/keys)")
    asyncio.run(serve(config, host, port))


class DemoFlow(StrEnum):
    """What ``dueflow demo`` sells."""

    MARKETPLACE = "marketplace"
    TICKETS = "tickets"
    SHOP = "shop"


@app.command()
def demo(
    orders_count: int = typer.Option(60, "--orders", min=1, max=5000, help="Orders to simulate."),
    speed: float = typer.Option(
        30.0, min=1.0, max=600.0, help="Simulated seconds per real second."
    ),
    db: Path | None = typer.Option(None, help="SQLite file (default: a fresh temporary one)."),
    seed: int = typer.Option(7, help="Random seed of the simulated people."),
    live: bool = typer.Option(True, help="Show the live progress view."),
    url: str | None = typer.Option(
        None,
        help="Run over HTTP against a `dueflow serve` (dev profile) at this URL, like "
        "http://127.0.0.1:8000, in the server's real time (--speed and --db do not apply).",
    ),
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="DUEFLOW_ADMIN_TOKEN",
        help="An admin's bearer token on the --url server.",
    ),
    flow: DemoFlow = typer.Option(
        DemoFlow.MARKETPLACE,
        help="What to sell: goods (marketplace), the seats of a show (tickets) or a shop's SKUs, "
        "coupons and a flash sale (shop); for tickets and shop --orders is the number of buyers.",
    ),
) -> None:
    """A simulated marketplace on the dev profile: buyers that pay, pay late, never pay or cancel;
    sellers that ship, ship late or never (or, with --flow tickets, a ticket sale: buyers racing
    for the same seats, a show cancelled; with --flow shop, a shop: stock, coupons, a flash
    sale, orders that expire). Ends with a table of outcomes and checked invariants."""
    if url is not None:
        from dueflow.demo import http as demo_http
        from dueflow.demo import http_shop as demo_http_shop
        from dueflow.demo import http_tickets as demo_http_tickets

        if not admin_token:
            err.print(
                "[red]error:[/red] --url needs an admin token: --admin-token or DUEFLOW_ADMIN_TOKEN"
            )
            raise typer.Exit(2)
        if flow is DemoFlow.TICKETS:
            sale = demo_http_tickets.run(
                url=url,
                admin_token=admin_token,
                buyers=orders_count,
                seed=seed,
                live=live,
                console=out,
            )
        elif flow is DemoFlow.SHOP:
            sale = demo_http_shop.run(
                url=url,
                admin_token=admin_token,
                buyers=orders_count,
                seed=seed,
                live=live,
                console=out,
            )
        else:
            sale = demo_http.run(
                url=url,
                admin_token=admin_token,
                orders=orders_count,
                seed=seed,
                live=live,
                console=out,
            )
        raise typer.Exit(0 if run(sale) else 1)
    from dueflow.demo import marketplace as demo_module
    from dueflow.demo import shop as demo_shop
    from dueflow.demo import tickets as demo_tickets

    if flow is DemoFlow.TICKETS:
        sale = demo_tickets.run(
            buyers=orders_count, speed=speed, db=db, seed=seed, live=live, console=out
        )
    elif flow is DemoFlow.SHOP:
        sale = demo_shop.run(
            buyers=orders_count, speed=speed, db=db, seed=seed, live=live, console=out
        )
    else:
        sale = demo_module.run(
            orders=orders_count, speed=speed, db=db, seed=seed, live=live, console=out
        )
    raise typer.Exit(0 if run(sale) else 1)


def main() -> None:
    """Entry point of the ``dueflow`` program."""
    app()


__all__ = ["app", "main"]
