"""Operator actions on refunds besides approve and retry: reject (with a reason) and settled
off-line (with a reference), from review or failed, final, each an audited order event; through
the service, the JSON API, the admin pages and the command line. And a refund the provider
failed for good waits for an operator, who sees it on the dashboard, in /metrics and in alerts.

The providers are fakes of the port (a unit test of the layers above it)."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from dueflow import bootstrap, cli
from dueflow.api.app import create_app
from dueflow.exceptions import InvalidInput, InvalidTransition, NotFound
from dueflow.payments.base import RefundResult
from dueflow.service import accounts, refunds
from dueflow.service.deps import Deps
from dueflow.store import schema
from dueflow.worker.scanner import scan_once
from tests.conftest import table_snapshot
from tests.unit.api import running_api
from tests.unit.api.test_admin_pages import csrf_of, log_in
from tests.unit.test_refunds import (
    ScriptedProvider,
    check_timer,
    refund_row,
    unshipped_refund,
    use,
)

ROOT = Path(__file__).resolve().parents[2]


async def timeline(world, order_id: int) -> list[tuple[str, str, str | None]]:
    async with world.deps.db.read() as conn:
        query = (
            select(
                schema.order_events.c.event,
                schema.order_events.c.actor,
                schema.order_events.c.detail,
            )
            .where(schema.order_events.c.order_id == order_id)
            .order_by(schema.order_events.c.id)
        )
        return [tuple(r) for r in (await conn.execute(query)).all()]


async def failed_refund(world) -> tuple[int, int, ScriptedProvider]:
    """A refund the provider failed for good: (order id, refund id, the provider), which
    still says failed when it is asked again (before an operator closes the refund)."""
    provider = ScriptedProvider([RefundResult.FAILED, RefundResult.FAILED])
    use(world, provider)
    order_id, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "failed"
    return order_id, refund_id, provider


# --------------------------------------------------------------------------- the service


async def test_a_refund_in_review_is_rejected_with_its_reason_audited(world):
    order_id, refund_id = await unshipped_refund(world)
    state = await refunds.reject(
        world.deps, refund_id, reason="  buyer kept the goods  ", actor="user:7"
    )
    assert state == "rejected"
    row = await refund_row(world, refund_id)
    assert (row.state, row.updated_at) == ("rejected", world.clock.now())
    event, actor, detail = (await timeline(world, order_id))[-1]
    assert (event, actor) == ("refund_rejected", "user:7")
    assert detail == f"{row.refund_no} 12.50: buyer kept the goods"


async def test_a_failed_refund_is_settled_off_line_keeping_the_providers_error(world):
    order_id, refund_id, provider = await failed_refund(world)
    state = await refunds.settle_offline(
        world.deps, refund_id, reference="ICBC transfer 0042", actor="user:9"
    )
    assert state == "settled_offline"
    row = await refund_row(world, refund_id)
    assert row.state == "settled_offline"
    assert row.last_error == "scripted failed"  # what the provider said stays on record
    assert (await timeline(world, order_id))[-1] == (
        "refund_settled_offline",
        "user:9",
        f"{row.refund_no} 12.50: ICBC transfer 0042",
    )
    # the approval, then one question where it stands before it is closed by hand
    assert len(provider.requests) == 2


@pytest.mark.parametrize("first", ["reject", "settle_offline"])
async def test_rejected_and_settled_are_final(world, first):
    _, refund_id = await unshipped_refund(world)
    if first == "reject":
        await refunds.reject(world.deps, refund_id, reason="no")
    else:
        await refunds.settle_offline(world.deps, refund_id, reference="cash at the counter")
    before = await table_snapshot(world.deps)
    for action in (
        refunds.approve(world.deps, refund_id),
        refunds.retry(world.deps, refund_id),
        refunds.reject(world.deps, refund_id, reason="again"),
        refunds.settle_offline(world.deps, refund_id, reference="again"),
    ):
        with pytest.raises(InvalidTransition):
            await action
    assert await table_snapshot(world.deps) == before


async def test_a_processing_refund_is_neither_rejected_nor_settled(world):
    """Issue 23: a processing refund may be closed by an operator, but not while the provider
    says it is processing it (its money may be on its way back)."""
    use(world, ScriptedProvider([RefundResult.PROCESSING] * 3))
    _, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    before = await table_snapshot(world.deps)
    with pytest.raises(InvalidTransition, match="still processing"):
        await refunds.reject(world.deps, refund_id, reason="changed my mind")
    with pytest.raises(InvalidTransition, match="processing"):
        await refunds.settle_offline(world.deps, refund_id, reference="T1")
    assert await table_snapshot(world.deps) == before


@pytest.mark.parametrize("note", ["", "   ", "x" * 201, "line\nbreak", "nul\x00", 42])
async def test_a_bad_reason_or_reference_changes_nothing(world, note):
    _, refund_id = await unshipped_refund(world)
    before = await table_snapshot(world.deps)
    with pytest.raises(InvalidInput, match="reason"):
        await refunds.reject(world.deps, refund_id, reason=note)
    with pytest.raises(InvalidInput, match="reference"):
        await refunds.settle_offline(world.deps, refund_id, reference=note)
    with pytest.raises(NotFound):
        await refunds.reject(world.deps, 999_999, reason="fine")
    assert await table_snapshot(world.deps) == before


async def test_two_operators_at_once_one_wins(world):
    _, refund_id = await unshipped_refund(world)
    results = await asyncio.gather(
        refunds.reject(world.deps, refund_id, reason="duplicate"),
        refunds.settle_offline(world.deps, refund_id, reference="T-7"),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, str)]
    assert len(won) == 1
    assert [type(r) for r in results if not isinstance(r, str)] == [InvalidTransition]
    assert (await refund_row(world, refund_id)).state == won[0]


# ---------------------------------------------- a refund failed for good waits for an operator


async def test_a_failed_refund_is_never_resubmitted_by_itself(world):
    order_id, refund_id, provider = await failed_refund(world)
    timer = await check_timer(world, order_id)
    assert timer.state == "cancelled"  # nothing left that would ask or resubmit
    for _ in range(5):
        world.clock.advance(timedelta(days=1))
        await world.worker.drain()
        await scan_once(world.worker)
    assert (await refund_row(world, refund_id)).state == "failed"
    assert len(provider.requests) == 1


async def test_failed_refunds_show_on_the_dashboard_and_in_metrics(world):
    _, refund_id, _ = await failed_refund(world)
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
    ) as client:
        assert 'dueflow_refunds{state="failed"} 1.0' in (await client.get("/metrics")).text
        await log_in(client, token)
        page = (await client.get("/admin")).text
        assert re.search(r'class="tile alarm" href="/admin/refunds\?state=failed"', page)
        assert "<b>1</b> refunds failed" in page
        await refunds.settle_offline(world.deps, refund_id, reference="T-1")
        metrics = (await client.get("/metrics")).text
        # a state no refund is in any more is not reported with its old count
        assert 'dueflow_refunds{state="failed"} 1.0' not in metrics
        assert 'dueflow_refunds{state="settled_offline"} 1.0' in metrics
        assert "<b>0</b> refunds failed" in (await client.get("/admin")).text


def test_an_alert_fires_for_a_refund_failed_for_an_hour():
    rules = yaml.safe_load((ROOT / "docs" / "alerts.yml").read_text())["groups"][0]["rules"]
    [rule] = [r for r in rules if 'dueflow_refunds{state="failed"}' in r["expr"]]
    assert rule["for"] == "1h"
    assert rule["expr"].replace(" ", "") == 'max(dueflow_refunds{state="failed"})>0'


# ----------------------------------------------------------------------------- the JSON API


async def test_the_api_rejects_and_settles_as_the_calling_admin(world):
    async with running_api(world.deps) as api:
        first, second = await api.refund(), await api.refund()
        rejected = await api.call(
            "POST", f"/api/admin/refunds/{first}/reject", "admin", json={"reason": "fraud"}
        )
        assert rejected.status_code == 200
        assert rejected.json() == {"id": first, "state": "rejected"}
        settled = await api.call(
            "POST",
            f"/api/admin/refunds/{second}/settle-offline",
            "admin",
            json={"reference": "交通银行 0042"},
        )
        assert settled.json() == {"id": second, "state": "settled_offline"}
        row = await refund_row(world, second)
        event = (await timeline(world, row.order_id))[-1]
        assert event == (
            "refund_settled_offline",
            f"user:{api.ids['admin']}",
            f"{row.refund_no} 12.50: 交通银行 0042",
        )
        again = await api.call(
            "POST", f"/api/admin/refunds/{first}/reject", "admin", json={"reason": "fraud"}
        )
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "invalid_transition"
        missing = await api.call(
            "POST", "/api/admin/refunds/999999/reject", "admin", json={"reason": "x"}
        )
        assert missing.status_code == 404


BAD_BODIES = [
    {},
    {"reason": ""},
    {"reason": "   "},
    {"reason": "x" * 201},
    {"reason": "tab\there"},
    {"reason": 5},
    {"reason": "ok", "extra": 1},
    {"reference": "wrong field"},
]


async def test_bad_bodies_are_422_and_change_no_row(world):
    async with running_api(world.deps) as api:
        refund_id = await api.refund()
        before = await table_snapshot(api.deps)
        for body in BAD_BODIES:
            answer = await api.call(
                "POST", f"/api/admin/refunds/{refund_id}/reject", "admin", json=body
            )
            assert answer.status_code == 422, (body, answer.text)
            assert set(answer.json()) == {"error"}
            swapped = {
                ("reference" if k == "reason" else "reason" if k == "reference" else k): v
                for k, v in body.items()
            }
            answer = await api.call(
                "POST", f"/api/admin/refunds/{refund_id}/settle-offline", "admin", json=swapped
            )
            assert answer.status_code == 422, (swapped, answer.text)
        assert await table_snapshot(api.deps) == before


async def test_both_routes_are_in_the_openapi_schema_with_their_models(world):
    spec = create_app(world.deps).openapi()
    for path, field in (("reject", "Rejection"), ("settle-offline", "OfflineSettlement")):
        operation = spec["paths"][f"/api/admin/refunds/{{refund_id}}/{path}"]["post"]
        ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": "#/components/schemas/RefundState"}
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{field}"}
        assert {"404", "409", "422"} <= set(operation["responses"])
    text = spec["components"]["schemas"]["Rejection"]["properties"]["reason"]
    assert (text["minLength"], text["maxLength"]) == (1, 200)


# ---------------------------------------------------------------------------- the admin pages


async def test_the_admin_pages_reject_and_settle_with_a_text_field_and_csrf(world):
    first, second = await _refund(world.deps, 0), await _refund(world.deps, 1)
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
    ) as client:
        await log_in(client, token)
        page = (await client.get("/admin/refunds?state=pending_review")).text
        assert f'action="/admin/refunds/{first}/reject"' in page
        assert f'action="/admin/refunds/{first}/settle-offline"' in page
        assert 'name="reason" required maxlength="200"' in page
        csrf = csrf_of(page)
        before = await table_snapshot(world.deps)
        forged = await client.post(f"/admin/refunds/{first}/reject", data={"reason": "x"})
        assert forged.status_code == 403
        empty = await client.post(
            f"/admin/refunds/{first}/reject", data={"csrf": csrf, "reason": " ", "back": "/admin"}
        )
        assert empty.status_code == 303
        assert "Refused: a reason is 1-200 characters" in (await client.get("/admin")).text
        assert await table_snapshot(world.deps) == before

        done = await client.post(
            f"/admin/refunds/{first}/reject",
            data={"csrf": csrf, "reason": "buyer kept it", "back": "/admin/refunds"},
        )
        assert done.headers["location"] == "/admin/refunds"
        assert (
            f"Refund {first} rejected: buyer kept it." in (await client.get("/admin/refunds")).text
        )
        settled = await client.post(
            f"/admin/refunds/{second}/settle-offline",
            data={"csrf": csrf, "reference": "T-0042", "back": "/admin/refunds"},
        )
        assert settled.status_code == 303
        page = (await client.get("/admin/refunds")).text
        assert f"Refund {second} settled offline: T-0042." in page
        assert "/reject" not in page  # final refunds offer no action
    assert (await refund_row(world, first)).state == "rejected"
    assert (await refund_row(world, second)).state == "settled_offline"


async def test_a_failed_refund_offers_retry_reject_and_settle(world):
    _, refund_id, _ = await failed_refund(world)
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
    ) as client:
        await log_in(client, token)
        page = (await client.get("/admin/refunds?state=failed")).text
    for action in ("retry", "reject", "settle-offline"):
        assert f'action="/admin/refunds/{refund_id}/{action}"' in page


# --------------------------------------------------------------------------- the command line


def test_the_command_line_rejects_and_settles(settings, monkeypatch):
    async def two_refunds() -> list[int]:
        async with bootstrap.running(settings, migrate_sqlite=False) as deps:
            return [await _refund(deps, n) for n in range(2)]

    first, second = asyncio.run(two_refunds())
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", settings.database_url)
    runner = CliRunner()
    done = runner.invoke(cli.app, ["refunds", "reject", str(first), "--reason", "duplicate"])
    assert done.exit_code == 0, done.output
    assert f"refund {first} rejected" in done.output
    done = runner.invoke(cli.app, ["refunds", "settle-offline", str(second), "--reference", "T-9"])
    assert done.exit_code == 0, done.output
    assert f"refund {second} settled_offline" in done.output
    again = runner.invoke(cli.app, ["refunds", "reject", str(second), "--reason", "x"])
    assert again.exit_code == 2
    assert "settled_offline, not pending_review or failed" in again.output
    empty = runner.invoke(cli.app, ["refunds", "reject", str(first), "--reason", " "])
    assert empty.exit_code == 2
    assert "a reason is 1-200 characters" in empty.output

    async def states() -> list[str]:
        async with bootstrap.running(settings, migrate_sqlite=False) as deps:
            return [r["state"] for r in await refunds.list_refunds(deps)]

    assert asyncio.run(states()) == ["settled_offline", "rejected"]  # newest first


async def _refund(deps: Deps, n: int) -> int:
    from dueflow.service import orders, payments

    seller, _ = await accounts.add_user(deps, f"seller{n}")
    buyer, _ = await accounts.add_user(deps, f"buyer{n}")
    goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="lamp", price="12.50")
    order_id = await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
    await payments.record_manual_payment(deps, order_id=order_id, amount="12.50")
    await orders.cancel_by_seller(deps, order_id=order_id, user_id=seller.id)
    [newest] = await refunds.list_refunds(deps, state="pending_review", limit=1)
    return int(newest["id"])


@pytest.mark.parametrize(
    ("answer", "outcome", "state"),
    [
        (RefundResult.SUCCEEDED, "has paid refund", "succeeded"),
        (RefundResult.PROCESSING, "still processing", "failed"),
        (RefundResult.UNKNOWN, "cannot tell where", "failed"),
    ],
)
@pytest.mark.parametrize("action", ["reject", "settle_offline"])
async def test_a_failed_refund_the_provider_may_have_paid_is_not_closed(
    world, answer, outcome, state, action
):
    """Found in review: a failed refund whose resubmission (an operator's retry) was still on
    its way could be rejected or settled off-line, and then be paid by the provider anyway. The
    provider is asked first: paid -> recorded succeeded; processing or no answer -> refused."""
    provider = ScriptedProvider([RefundResult.FAILED, answer])
    use(world, provider)
    order_id, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "failed"
    note = {"reason": "duplicate"} if action == "reject" else {"reference": "ICBC 1"}
    with pytest.raises(Exception, match=outcome) as refused:
        await getattr(refunds, action)(world.deps, refund_id, actor="user:9", **note)
    assert type(refused.value).__name__ in ("InvalidTransition", "ProviderUnavailable")
    assert (await refund_row(world, refund_id)).state == state
    events = [e for e, _, _ in await timeline(world, order_id)]
    assert "refund_rejected" not in events and "refund_settled_offline" not in events
    assert events.count("refund_succeeded") == (1 if state == "succeeded" else 0)
