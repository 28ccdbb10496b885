"""``dueflow orders``: place (goods, seats, SKU units or a flash sale's), cancel, ship, confirm,
review and show an order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import typer

from dueflow.cli import shop as cli_shop
from dueflow.cli import shows as cli_shows
from dueflow.cli._common import (
    multiline,
    one_line,
    out,
    run,
    settings_or_exit,
    with_deps,
)
from dueflow.cli._lazy import accounts, orders, render

if TYPE_CHECKING:
    from dueflow.service.deps import Deps

app = typer.Typer(no_args_is_help=True, help="Place and inspect orders.")


@app.command("place")
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


def _act(name: str, action: Callable[[Deps, int], Awaitable[Any]], done: str) -> None:
    """``action(deps, id)`` as the user ``name``, then ``done`` printed."""

    async def go(deps: Deps) -> str:
        user = await accounts.get_user(deps, name)
        await action(deps, user.id)
        return "ok"

    run(with_deps(settings_or_exit(), go))
    out.print(done)


@app.command("cancel")
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

    _act(user, cancel, f"order {order_id} cancelled")


@app.command("ship")
def orders_ship(
    order_id: int,
    user: str = typer.Option(..., "--as", help="The seller's name."),
    carrier: str = typer.Option(..., callback=one_line),
    tracking_no: str = typer.Option(..., "--tracking-no", callback=one_line),
) -> None:
    """The seller ships an order."""
    ship = partial(orders.ship, order_id=order_id, carrier=carrier, tracking_no=tracking_no)
    _act(
        user,
        lambda d, uid: ship(d, user_id=uid),
        f"order {order_id} shipped with {carrier} {tracking_no}",
    )


@app.command("confirm")
def orders_confirm(
    order_id: int, user: str = typer.Option(..., "--as", help="The buyer's name.")
) -> None:
    """The buyer confirms receipt."""
    receive = partial(orders.confirm_receipt, order_id=order_id)
    _act(user, lambda d, uid: receive(d, user_id=uid), f"order {order_id} received")


@app.command("review")
def orders_review(
    order_id: int,
    user: str = typer.Option(..., "--as", help="Buyer or seller name."),
    rating: int = typer.Option(..., min=1, max=5),
    comment: str = typer.Option("", callback=multiline),
) -> None:
    """The buyer or the seller reviews a received order."""
    review = partial(orders.review, order_id=order_id, rating=rating, comment=comment)
    _act(user, lambda d, uid: review(d, user_id=uid), f"order {order_id} reviewed by {user}")


@app.command("show")
def orders_show(order_id: int) -> None:
    """Show an order with its timers and timeline."""
    view = run(with_deps(settings_or_exit(), lambda d: orders.order_view(d, order_id)))
    render.print_order(out, view)
