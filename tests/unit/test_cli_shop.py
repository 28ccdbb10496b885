"""The shop's command line through typer's CliRunner on a migrated SQLite file (the real
clock): ``dueflow skus``, ``coupons``, ``flash``, the shop cases of ``orders place``, the shop
order in ``orders show`` and the invariants in ``dueflow status``; what each prints, and every
refusal's message and exit status (2: refused, nothing changed)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from dueflow import bootstrap, cli
from dueflow.config import Settings
from dueflow.service import shop
from dueflow.service.deps import Deps
from tests.conftest import table_snapshot

Run = Callable[..., Result]


@pytest.fixture
def run(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Run:
    """``run("skus", "list")`` runs ``dueflow skus list`` on the test's database, where users
    seller, buyer and other exist."""
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DUEFLOW_PROFILE", "prod")
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(cli.app, list(args))

    for name in ("seller", "buyer", "other"):
        assert invoke("users", "add", name).exit_code == 0
    return invoke


def on_db(settings: Settings, action: Callable[[Deps], Any]) -> Any:
    async def go() -> Any:
        async with bootstrap.running(settings, migrate_sqlite=False) as deps:
            return await action(deps)

    return asyncio.run(go())


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def refused(result: Result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output


def first_id(text: str) -> int:
    return int(re.search(r"\b(\d+)\b", text).group(1))


def a_shop(run: Run) -> tuple[int, int, int]:
    """A mug (10 in stock at 25.00), a coupon template of 5.00 off from 20.00 (two to issue)
    and a coupon of it issued to buyer: (sku, template, coupon)."""
    sku = first_id(
        ok(
            run(
                "skus",
                "add",
                "--seller",
                "seller",
                "--title",
                "mug",
                "--price",
                "25",
                "--stock",
                "10",
            )
        )
    )
    template = first_id(
        ok(
            run(
                "coupons",
                "template",
                "--seller",
                "seller",
                "--off",
                "5",
                "--min",
                "20",
                "--days",
                "30",
                "--total",
                "2",
            )
        )
    )
    coupon = first_id(ok(run("coupons", "issue", str(template), "--to", "buyer")))
    return sku, template, coupon


def test_skus_are_added_restocked_shown_and_listed(run):
    added = ok(
        run("skus", "add", "--seller", "seller", "--title", "mug", "--price", "25", "--stock", "10")
    )
    assert added == "sku 1 on sale: mug at 25.00, 10 in stock\n"
    restocked = ok(run("skus", "restock", "1", "5", "--seller", "seller"))
    assert restocked == "sku 1 restocked: stock 15, held 0, sold 0, stocked 15\n"
    shown = ok(run("skus", "show", "1"))
    assert (
        shown
        == "sku 1 mug at 25.00, seller seller (user 1): stock 15, held 0, sold 0, stocked 15\n"
    )
    ok(
        run(
            "skus", "add", "--seller", "other", "--title", "spoon", "--price", "3.5", "--stock", "0"
        )
    )
    listed = ok(run("skus", "list"))
    assert listed.index("spoon") < listed.index("mug")  # newest first
    mug_row = next(line for line in listed.splitlines() if "mug" in line)
    assert re.findall(r"\b\d+(?:\.\d+)?\b", mug_row) == ["1", "25.00", "15", "0", "0", "15"]


def test_sku_refusals_name_the_problem_and_change_nothing(run, settings):
    ok(run("skus", "add", "--seller", "seller", "--title", "mug", "--price", "25", "--stock", "10"))
    before = on_db(settings, table_snapshot)
    add = ("skus", "add", "--title", "mug")
    refused(run(*add, "--seller", "nobody", "--price", "1", "--stock", "1"), "no user 'nobody'")
    refused(run(*add, "--seller", "seller", "--price", "-1", "--stock", "1"), "not an amount: '-1'")
    refused(
        run(*add, "--seller", "seller", "--price", "1", "--stock", "-1"),
        "stock is a whole number from 0 to 10000000",
    )
    refused(
        run(
            "skus",
            "add",
            "--seller",
            "seller",
            "--title",
            "mu\x1bg",
            "--price",
            "1",
            "--stock",
            "1",
        ),
        "U+001B",
    )
    refused(
        run("skus", "restock", "1", "5", "--seller", "other"),
        "only the seller of sku 1 may restock it",
    )
    refused(run("skus", "restock", "9", "5", "--seller", "seller"), "no sku 9")
    refused(
        run("skus", "restock", "1", "0", "--seller", "seller"), "quantity is a whole number from 1"
    )
    refused(run("skus", "show", "9"), "no sku 9")
    assert on_db(settings, table_snapshot) == before


def test_coupons_are_templated_issued_and_listed(run):
    sku, template, coupon = a_shop(run)
    assert (template, coupon) == (1, 1)
    again = ok(run("coupons", "template", "--seller", "seller", "--off", "1.5", "--total", "1"))
    assert again.startswith(
        "coupon template 2 (1.50 off): 1.50 off orders of at least 0.00, valid until "
    )
    assert again.endswith(" UTC, 1 to issue\n")
    issued = ok(run("coupons", "issue", "1", "--to", "other"))
    assert re.fullmatch(
        r"coupon 2 issued to other: 5\.00 off orders of at least 20\.00, valid until "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n",
        issued,
    )
    ok(run("orders", "place", "--buyer", "buyer", "--sku", f"{sku}x1", "--coupon", str(coupon)))
    listed = ok(run("coupons", "list", "--user", "buyer"))
    row = next(line for line in listed.splitlines() if "5.00 off" in line)
    assert "locked" in row and "20.00" in row
    assert "available" in ok(run("coupons", "list", "--user", "other"))


def test_coupon_refusals_name_the_problem_and_change_nothing(run, settings):
    a_shop(run)
    ok(run("coupons", "issue", "1", "--to", "other"))  # the template's second and last
    before = on_db(settings, table_snapshot)
    template = ("coupons", "template", "--seller", "seller", "--total", "1")
    refused(run(*template, "--off", "x"), "not an amount: 'x' (write it like 12.50)")
    refused(
        run("coupons", "template", "--seller", "seller", "--off", "1", "--total", "0"),
        "total is a whole number from 1",
    )
    refused(run(*template, "--off", "1", "--days", "0"), "--days")
    refused(
        run("coupons", "template", "--seller", "nobody", "--off", "1", "--total", "1"),
        "no user 'nobody'",
    )
    refused(
        run("coupons", "issue", "1", "--to", "buyer"), "all 2 coupons of template 1 were issued"
    )
    refused(run("coupons", "issue", "9", "--to", "buyer"), "no coupon template 9")
    refused(run("coupons", "issue", "1", "--to", "nobody"), "no user 'nobody'")
    refused(run("coupons", "list", "--user", "nobody"), "no user 'nobody'")
    assert on_db(settings, table_snapshot) == before


def test_flash_sales_are_added_and_shown(run):
    sku, _, _ = a_shop(run)
    added = ok(
        run(
            "flash",
            "add",
            "--seller",
            "seller",
            "--sku",
            str(sku),
            "--price",
            "9.9",
            "--stock",
            "3",
            "--minutes",
            "30",
            "--limit",
            "1",
        )
    )
    assert added.startswith(
        "flash sale 1 of sku 1 at 9.90 (open): sold 0, held 0, left 3 of 3; 1 a buyer; "
    )
    ok(run("orders", "place", "--buyer", "other", "--flash", "1", "--quantity", "1"))
    shown = ok(run("flash", "show", "1"))
    assert shown.startswith("flash sale 1 of sku 1 at 9.90 (open): sold 0, held 1, left 2 of 3; ")
    assert "flash sale 1 of sku 1" in ok(run("skus", "show", str(sku)))


def test_flash_refusals_name_the_problem_and_change_nothing(run, settings):
    sku, _, _ = a_shop(run)
    before = on_db(settings, table_snapshot)
    add = ("flash", "add", "--sku", str(sku), "--price", "9.9")
    refused(run(*add, "--seller", "seller", "--stock", "99"), "sku 1 has 10 units on sale, not 99")
    refused(
        run(*add, "--seller", "other", "--stock", "1"),
        "only the seller of sku 1 may put it on a flash sale",
    )
    refused(
        run("flash", "add", "--sku", "9", "--price", "1", "--seller", "seller", "--stock", "1"),
        "no sku 9",
    )
    refused(
        run(*add, "--seller", "seller", "--stock", "1", "--limit", "0"),
        "per_buyer_limit is a whole number",
    )
    refused(run(*add, "--seller", "seller", "--stock", "1", "--minutes", "0"), "--minutes")
    refused(run("flash", "show", "9"), "no flash sale 9")
    assert on_db(settings, table_snapshot) == before


def test_shop_and_flash_orders_are_placed_and_shown(run, settings):
    sku, _, coupon = a_shop(run)
    spoon = first_id(
        ok(
            run(
                "skus",
                "add",
                "--seller",
                "seller",
                "--title",
                "spoon",
                "--price",
                "0.5",
                "--stock",
                "4",
            )
        )
    )
    placed = ok(
        run(
            "orders",
            "place",
            "--buyer",
            "buyer",
            "--sku",
            f"{sku}x2,{spoon}",
            "--coupon",
            str(coupon),
        )
    )
    assert re.fullmatch(
        r"order 1 \(shop\) pending_payment: 45\.50 for sku 1 x2 at 25\.00, sku 2 x1 at 0\.50, "
        r"coupon 1 \(-5\.00\), due by \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n",
        placed,
    )
    ok(
        run(
            "flash",
            "add",
            "--seller",
            "seller",
            "--sku",
            str(sku),
            "--price",
            "9.9",
            "--stock",
            "3",
            "--limit",
            "2",
        )
    )
    flash = ok(run("orders", "place", "--buyer", "other", "--flash", "1", "--quantity", "2"))
    assert flash.startswith(
        "order 2 (flash) pending_payment: 19.80 for sku 1 x2 at 9.90, flash sale 1 x2, due by "
    )
    one = ok(run("orders", "place", "--buyer", "buyer", "--flash", "1"))
    assert one.startswith(
        "order 3 (flash) pending_payment: 9.90 for sku 1 x1 at 9.90, flash sale 1 x1"
    )
    ok(run("orders", "cancel", "1", "--as", "buyer"))
    shown = ok(run("orders", "show", "1"))
    assert "sku 1 x2 at 25.00, sku 2 x1 at 0.50, coupon 1 (-5.00)" in shown
    assert "(buyer_cancel)" in shown and "order_closed" in shown  # the notice's timer
    mug = on_db(settings, lambda d: shop.sku_view(d, sku))
    assert (mug["stock"], mug["held"], mug["sold"]) == (7, 3, 0)  # order 1 gave its 2 back


def test_order_refusals_name_the_problem_and_change_nothing(run, settings):
    sku, _, coupon = a_shop(run)
    ok(
        run(
            "flash",
            "add",
            "--seller",
            "seller",
            "--sku",
            str(sku),
            "--price",
            "9.9",
            "--stock",
            "3",
            "--limit",
            "1",
        )
    )
    ok(run("orders", "place", "--buyer", "other", "--flash", "1"))
    ok(run("orders", "place", "--buyer", "buyer", "--sku", f"{sku}x1", "--coupon", str(coupon)))
    before = on_db(settings, table_snapshot)
    place = ("orders", "place", "--buyer")
    refused(run(*place, "other", "--sku", f"{sku}x99"), "sku 1 (mug): 8 left, 99 asked")
    refused(
        run(*place, "buyer", "--sku", f"{sku}x1", "--coupon", str(coupon)),
        "coupon 1 is locked by order 2",
    )
    refused(
        run(*place, "other", "--sku", f"{sku}x1", "--coupon", str(coupon)), "coupon 1 is not yours"
    )
    refused(run(*place, "seller", "--sku", f"{sku}x1"), "you cannot buy your own SKUs")
    refused(run(*place, "buyer", "--sku", "9x1"), "no sku 9")
    refused(
        run(*place, "other", "--flash", "1"),
        "flash sale 1 allows 1 a buyer; you hold or bought 1 and asked for 1 more",
    )
    refused(run(*place, "seller", "--flash", "1"), "you cannot buy at your own flash sale")
    refused(run(*place, "buyer", "--flash", "9"), "no flash sale 9")
    refused(
        run(*place, "buyer", "--flash", "1", "--quantity", "0"), "quantity is a whole number from 1"
    )
    refused(run(*place, "nobody", "--sku", f"{sku}x1"), "no user 'nobody'")
    # What the command line itself refuses, before the service is asked.
    for bad in ("ax2", "1x", "1x2x3", "", "1,,2", "²"):
        refused(run(*place, "buyer", "--sku", bad), "is not SKUxUNITS, like 3x2")
    refused(
        run(*place, "buyer", "--sku", "1", "--flash", "1"),
        "give --sku (with --coupon, if any) or --flash",
    )
    refused(
        run(*place, "buyer", "--flash", "1", "--coupon", "1"),
        "a coupon goes with --sku orders only",
    )
    refused(run(*place, "buyer", "--sku", "1", "--quantity", "2"), "--quantity goes with --flash")
    refused(run(*place, "buyer", "--coupon", "1"), "give --sku (with --coupon, if any) or --flash")
    refused(
        run("orders", "place", "7", "--buyer", "buyer", "--sku", "1"),
        "give goods, --show and --seats, --sku or --flash: one",
    )
    refused(run(*place, "buyer"), "give a goods id, --show with --seats, --sku or --flash")
    assert on_db(settings, table_snapshot) == before


def test_status_shows_the_shop_invariants(run):
    sku, _, coupon = a_shop(run)
    ok(run("orders", "place", "--buyer", "buyer", "--sku", f"{sku}x1", "--coupon", str(coupon)))
    status = ok(run("status"))
    assert "orders pending_payment" in status
    for name in (
        "SKU stock + held + sold = stocked",
        "no coupon locked by a dead order",
        "no coupon used twice",
        "every cancelled order notified once",
    ):
        row = next(line for line in status.splitlines() if name in line)
        assert "PASS" in row
