"""``dueflow webhooks ...`` through typer's CliRunner on a migrated SQLite file: add (its secret
printed once), list, show, disable, enable, types, rotate (a new secret printed once), replay and
delete; what each prints and stores, the secrets in no other command's output nor the logs,
and every refusal's message and exit status (2: refused, nothing changed)."""

from __future__ import annotations

import logging
import re

import pytest
from click.testing import Result
from sqlalchemy import select
from typer.testing import CliRunner

from dueflow import cli
from dueflow.cli import _common
from dueflow.config import Settings
from dueflow.service import accounts, events, orders
from dueflow.store import webhook_endpoints as endpoint_store
from dueflow.store.schema import event_deliveries
from tests.conftest import table_snapshot
from tests.envelopes import seq_of
from tests.unit.test_cli_shop import Run, ok, on_db, refused

PUBLIC = "http://93.184.216.34/hooks"  # a public address: no name to resolve, nothing sent
SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]+")


@pytest.fixture
def run(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Run:
    """``run("webhooks", "list")`` runs ``dueflow webhooks list`` on the test's database
    (users seller and buyer), printed wide enough for a URL on one line."""
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DUEFLOW_PROFILE", "prod")
    monkeypatch.setenv("COLUMNS", "200")
    # The command line's console took its width when first imported (80 without a terminal,
    # perhaps by another test): a table's line each, unwrapped, whatever ran before.
    monkeypatch.setattr(_common.out, "width", 200)
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(cli.app, list(args))

    for name in ("seller", "buyer"):
        assert invoke("users", "add", name).exit_code == 0
    return invoke


def secret_of(text: str) -> str:
    [secret] = SECRET.findall(text)
    return secret


def stored(settings: Settings, endpoint_id: int):
    async def row(deps):
        async with deps.db.read() as conn:
            return await endpoint_store.get(conn, endpoint_id)

    return on_db(settings, row)


def events_made(settings: Settings) -> int:
    """An order placed and cancelled (three events, numbered); the last seq."""

    async def go(deps) -> int:
        seller = await accounts.get_user(deps, "seller")
        buyer = await accounts.get_user(deps, "buyer")
        goods = await accounts.add_goods(deps, seller_id=seller.id, title="lamp", price="9.90")
        order_id = await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods)
        await orders.cancel_by_buyer(deps, order_id=order_id, user_id=buyer.id)
        await events.sequence(deps)
        return seq_of((await events.feed(deps, after=0, limit=100))[-1])

    return on_db(settings, go)


def test_add_list_show_disable_rotate_replay_delete(run, settings, caplog):
    caplog.set_level(logging.DEBUG)
    added = ok(run("webhooks", "add", PUBLIC, "--type", "place", "--type", "pay"))
    first = secret_of(added)
    endpoint_id = int(re.search(r"endpoint (\d+) \(pay place\) secret: whsec_", added).group(1))
    row = stored(settings, endpoint_id)
    assert (row.url, row.event_types, row.enabled, row.secret) == (PUBLIC, "pay place", True, first)
    assert row.created_by == "cli"

    listed = ok(run("webhooks", "list"))
    assert PUBLIC in listed and "pay place" in listed and "yes" in listed
    shown = ok(run("webhooks", "show", str(endpoint_id)))
    assert f"url: {PUBLIC}" in shown and "backlog: 0" in shown and "failures: 0" in shown

    assert ok(run("webhooks", "disable", str(endpoint_id))).startswith(
        f"endpoint {endpoint_id}: disabled, types pay place"
    )
    assert stored(settings, endpoint_id).enabled is False
    assert re.search(r"\bno\b", ok(run("webhooks", "list")))
    assert f"{endpoint_id}: enabled" in ok(run("webhooks", "enable", str(endpoint_id)))
    assert "types (all)" in ok(run("webhooks", "types", str(endpoint_id)))
    assert stored(settings, endpoint_id).event_types is None

    rotated = ok(run("webhooks", "rotate", str(endpoint_id), "--keep-old-for", "60"))
    second = secret_of(rotated)
    assert rotated.startswith(f"endpoint {endpoint_id} secret: whsec_") and second != first
    row = stored(settings, endpoint_id)
    assert (row.secret, row.previous_secret) == (second, first)

    last = events_made(settings)
    told = ok(run("webhooks", "replay", str(endpoint_id), "1", str(last)))
    assert "queued to be delivered again" in told

    async def replays(deps):
        async with deps.db.read() as conn:
            query = select(event_deliveries).where(event_deliveries.c.endpoint_id == endpoint_id)
            return [(r.delivered_seq, r.until_seq) for r in (await conn.execute(query)).all()]

    assert (0, last) in on_db(settings, replays)
    # the secrets were printed by add and rotate only: no other command, nor the logs
    others = [ok(run("webhooks", "list")), ok(run("webhooks", "show", str(endpoint_id)))]
    assert not any(SECRET.search(text) for text in [*others, listed, shown, told])
    assert "made by cli" in caplog.text and "rotated by cli" in caplog.text  # logs were read
    assert first not in caplog.text and second not in caplog.text

    assert ok(run("webhooks", "delete", str(endpoint_id))) == f"endpoint {endpoint_id} deleted\n"
    assert stored(settings, endpoint_id) is None
    assert on_db(settings, replays) == []
    assert "webhook endpoints" in ok(run("webhooks", "list"))  # the empty table's title


def test_refusals_exit_2_and_change_nothing(run, settings, monkeypatch):
    endpoint_id = int(re.search(r"endpoint (\d+)", ok(run("webhooks", "add", PUBLIC))).group(1))
    last = events_made(settings)
    before = on_db(settings, table_snapshot)
    for args, message in [
        (("add", "http://127.0.0.1:9/hooks"), "private, loopback"),
        (("add", "http://169.254.169.254/latest"), "private, loopback"),
        (("add", "ftp://93.184.216.34/"), "http:// or https://"),
        (("add", PUBLIC, "--type", "Not-A-Type"), "is not an order event type"),
        (("add", PUBLIC, "--type", "pay", "--type", "refund"), "is not an order event type"),
        (("types", str(endpoint_id), "no such type"), "is not an order event type"),
        (("types", str(endpoint_id), "placed"), "is not an order event type"),
        (("types", str(endpoint_id), "order_closed"), "is a buyer notice"),
        (("replay", str(endpoint_id), "3", "2"), "a first event"),
        (("replay", str(endpoint_id), "1", str(last + 1)), "no event"),
        (("rotate", "999"), "no webhook endpoint 999"),
        (("disable", "999"), "no webhook endpoint 999"),
        (("show", "999"), "no webhook endpoint 999"),
        (("delete", "999"), "no webhook endpoint 999"),
    ]:
        result = run("webhooks", *args)
        refused(result, message)
        assert not SECRET.search(result.output)
    # out of range or not a number: typer's usage error, exit 2 as well
    for args in (("rotate", str(endpoint_id), "--keep-old-for", "-1"), ("show", "x")):
        assert run("webhooks", *args).exit_code == 2
    assert on_db(settings, table_snapshot) == before
    # DUEFLOW_WEBHOOK_ALLOW_PRIVATE lets a private address through
    monkeypatch.setenv("DUEFLOW_WEBHOOK_ALLOW_PRIVATE", "true")
    assert secret_of(ok(run("webhooks", "add", "http://127.0.0.1:9/hooks")))
