"""The shop commands: ``dueflow skus`` (add, restock, show, list), ``dueflow coupons``
(template, issue, list), ``dueflow flash`` (add, show), and the shop cases of ``dueflow orders
place`` (``--sku 3x2,5x1 [--coupon ID]`` or ``--flash ID [--quantity N]``).

It takes the error handling and the output consoles from :mod:`dueflow.cli._common`;
:mod:`dueflow.cli` registers its typer apps.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import accounts, render, shop, shop_overview
from dueflow.domain.money import parse_yuan

if TYPE_CHECKING:
    from dueflow.service.deps import Deps

skus_app = typer.Typer(no_args_is_help=True, help="Put SKUs on sale, restock them, read them.")
coupons_app = typer.Typer(no_args_is_help=True, help="Coupon templates and coupons.")
flash_app = typer.Typer(no_args_is_help=True, help="Flash sales of a SKU.")

#: Longest coupon validity and flash sale window the commands take.
MAX_DAYS = 3650
MAX_MINUTES = 60 * 24 * 365
#: One part of ``--sku``: a SKU id and, after an ``x``, its units (1 without).
SKU_UNITS = re.compile(r"([0-9]{1,19})(?:x([0-9]{1,9}))?")


def _when(value: Any) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC"


def _say(text: str) -> None:
    out.print(text, soft_wrap=True, highlight=False, markup=False)


def _units(sku: dict[str, Any]) -> str:
    return f"stock {sku['stock']}, held {sku['held']}, sold {sku['sold']}, stocked {sku['stocked']}"


def sku_lines(value: str) -> list[dict[str, int]]:
    """``"3x2,5x1"`` (or ``"3"``: one unit) -> ``[{"sku_id": 3, "quantity": 2}, ...]``; the
    service checks ids and quantities.

    Raises:
        typer.BadParameter: a part is not ``SKU`` or ``SKUxUNITS`` in digits.
    """
    lines = []
    for part in (p.strip() for p in value.split(",")):
        found = SKU_UNITS.fullmatch(part)
        if found is None:
            raise typer.BadParameter(
                f"{part!r} is not SKUxUNITS, like 3x2 (sku 3, 2 units)", param_hint="--sku"
            )
        lines.append({"sku_id": int(found[1]), "quantity": int(found[2] or "1")})
    return lines


# --- skus -----------------------------------------------------------------------------------


@skus_app.command("add")
def skus_add(
    seller: str = typer.Option(..., help="The selling user's name."),
    title: str = typer.Option(..., callback=one_line),
    price: str = typer.Option(..., help="Yuan, like 25.00."),
    stock: int = typer.Option(..., help="Units on sale."),
) -> None:
    """Put a SKU on sale for a seller."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, seller)
        return await shop.create_sku(deps, seller_id=user.id, title=title, price=price, stock=stock)

    sku = run(with_deps(settings_or_exit(), go))
    _say(f"sku {sku['id']} on sale: {sku['title']} at {sku['price']}, {sku['stock']} in stock")


@skus_app.command("restock")
def skus_restock(
    sku_id: int,
    quantity: int,
    seller: str = typer.Option(..., help="The SKU's seller's name."),
) -> None:
    """The seller puts more units of a SKU on sale."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, seller)
        return await shop.restock(deps, sku_id=sku_id, user_id=user.id, quantity=quantity)

    sku = run(with_deps(settings_or_exit(), go))
    _say(f"sku {sku['id']} restocked: {_units(sku)}")


@skus_app.command("show")
def skus_show(sku_id: int) -> None:
    """A SKU, its units and its flash sales."""
    sku = run(with_deps(settings_or_exit(), lambda d: shop_overview.sku_page(d, sku_id, 0)))
    _say(
        f"sku {sku['id']} {sku['title']} at {sku['price']}, seller {sku['seller']}"
        f" (user {sku['seller_id']}): {_units(sku)}"
    )
    for sale in sku["flash_sales"]:
        _say(f"  {_sale_line(sale)}")


@skus_app.command("list")
def skus_list(
    limit: int = typer.Option(100, min=1, max=10_000, help="At most this many, newest first."),
) -> None:
    """SKUs with their units, newest first."""
    rows = run(with_deps(settings_or_exit(), lambda d: shop_overview.skus_overview(d, limit)))
    columns = ("id", "title", "seller", "price", "stock", "held", "sold", "stocked")
    out.print(render.table_of(rows, {name: name for name in columns}))


# --- coupons --------------------------------------------------------------------------------


@coupons_app.command("template")
def coupons_template(
    seller: str = typer.Option(..., help="The selling user's name: its SKUs take the coupons."),
    off: str = typer.Option(..., help="Yuan off, like 5.00."),
    minimum: str = typer.Option("0", "--min", help="Smallest order it applies to, in yuan."),
    days: int = typer.Option(30, min=1, max=MAX_DAYS, help="Valid from now for this many days."),
    total: int = typer.Option(..., help="How many coupons may be issued."),
    title: str | None = typer.Option(None, callback=one_line, help="Default: '<off> off'."),
) -> None:
    """A coupon template of a seller, valid from now."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, seller)
        now = deps.clock.now()
        return await shop.create_template(
            deps,
            seller_id=user.id,
            title=title if title is not None else f"{parse_yuan(off)} off",
            amount_off=off,
            min_amount=minimum,
            valid_from=now,
            valid_until=now + timedelta(days=days),
            total=total,
        )

    tpl = run(with_deps(settings_or_exit(), go))
    _say(
        f"coupon template {tpl['id']} ({tpl['title']}): {tpl['amount_off']} off orders of at"
        f" least {tpl['min_amount']}, valid until {_when(tpl['valid_until'])},"
        f" {tpl['total']} to issue"
    )


@coupons_app.command("issue")
def coupons_issue(
    template_id: int, to: str = typer.Option(..., "--to", help="The user's name.")
) -> None:
    """Issue one coupon of a template to a user (as an operator)."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, to)
        tpl = await shop.template_view(deps, template_id)
        return await shop.issue_coupon(
            deps,
            template_id=template_id,
            issuer_id=tpl["seller_id"],
            user_id=user.id,
            admin=True,
        )

    coupon = run(with_deps(settings_or_exit(), go))
    _say(
        f"coupon {coupon['id']} issued to {to}: {coupon['amount_off']} off orders of at least"
        f" {coupon['min_amount']}, valid until {_when(coupon['valid_until'])}"
    )


@coupons_app.command("list")
def coupons_list(user: str = typer.Option(..., help="The owner's name.")) -> None:
    """A user's coupons, newest first."""

    async def go(deps: Deps) -> list[dict[str, Any]]:
        owner = await accounts.get_user(deps, user)
        return await shop.coupons_of(deps, owner.id)

    rows = run(with_deps(settings_or_exit(), go))
    columns: dict[str, render.Column] = {
        "id": "id",
        "title": "title",
        "seller": "seller_id",
        "off": "amount_off",
        "min": "min_amount",
        "state": "state",
        "order": "order_id",
        "valid until": lambda c: _when(c["valid_until"]),
    }
    out.print(render.table_of(rows, columns))


# --- flash sales ----------------------------------------------------------------------------


def _sale_line(sale: dict[str, Any]) -> str:
    return (
        f"flash sale {sale['id']} of sku {sale['sku_id']} at {sale['price']} ({sale['window']}):"
        f" sold {sale['sold']}, held {sale['held']}, left {sale['stock']} of {sale['stocked']};"
        f" {sale['per_buyer_limit']} a buyer; {_when(sale['starts_at'])} to"
        f" {_when(sale['ends_at'])}"
    )


@flash_app.command("add")
def flash_add(
    seller: str = typer.Option(..., help="The SKU's seller's name."),
    sku: int = typer.Option(..., help="The SKU on sale."),
    price: str = typer.Option(..., help="The sale's price in yuan."),
    stock: int = typer.Option(..., help="The sale's units (a quota of the SKU's stock)."),
    minutes: int = typer.Option(60, min=1, max=MAX_MINUTES, help="Open from now this long."),
    limit: int = typer.Option(1, help="Units one buyer may hold or buy."),
) -> None:
    """A flash sale of a seller's SKU, open from now."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, seller)
        now = deps.clock.now()
        sale = await shop.create_flash_sale(
            deps,
            seller_id=user.id,
            sku_id=sku,
            price=price,
            stock=stock,
            starts_at=now,
            ends_at=now + timedelta(minutes=minutes),
            per_buyer_limit=limit,
        )
        return {**sale, "window": shop_overview.window(sale, now)}

    _say(_sale_line(run(with_deps(settings_or_exit(), go))))


@flash_app.command("show")
def flash_show(sale_id: int) -> None:
    """A flash sale: what it sold, holds and has left, its window and its limit."""

    async def go(deps: Deps) -> dict[str, Any]:
        sale = await shop.flash_sale_view(deps, sale_id)
        return {**sale, "window": shop_overview.window(sale, deps.clock.now())}

    _say(_sale_line(run(with_deps(settings_or_exit(), go))))


# --- orders ---------------------------------------------------------------------------------


def place_units(
    buyer: str,
    *,
    sku: str | None,
    coupon: int | None,
    flash: int | None,
    quantity: int | None,
) -> None:
    """``dueflow orders place --buyer NAME --sku 3x2,5x1 [--coupon ID]`` (a ``shop`` order) or
    ``--flash ID [--quantity N]`` (a ``flash`` order): hold the units and print the order."""
    if (sku is None) == (flash is None):
        raise typer.BadParameter("give --sku (with --coupon, if any) or --flash (with --quantity)")
    if sku is None and coupon is not None:
        raise typer.BadParameter("a coupon goes with --sku orders only", param_hint="--coupon")
    if flash is None and quantity is not None:
        raise typer.BadParameter("--quantity goes with --flash; --sku says units as 3x2")
    lines = sku_lines(sku) if sku is not None else []

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, buyer)
        if flash is not None:
            return await shop.place_flash_order(
                deps,
                buyer_id=user.id,
                flash_sale_id=flash,
                quantity=1 if quantity is None else quantity,
            )
        return await shop.place_shop_order(deps, buyer_id=user.id, lines=lines, coupon_id=coupon)

    view = run(with_deps(settings_or_exit(), go))
    _say(
        f"order {view['id']} ({view['order_type']}) {view['status']}: {view['amount']} for"
        f" {render.lines_text(view['lines'])}, due by {_when(view['pay_deadline'])}"
    )
