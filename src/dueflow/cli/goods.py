"""``dueflow goods add``: put goods on sale for a seller (the marketplace flow)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import accounts

if TYPE_CHECKING:
    from dueflow.service.deps import Deps

app = typer.Typer(no_args_is_help=True, help="Put goods on sale.")


@app.command("add")
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
