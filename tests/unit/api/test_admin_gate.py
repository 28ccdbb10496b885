"""A show's gate page over the ASGI app on SQLite with a FakeClock: an organizer signs in with
their personal token (a gate session for their own shows only, never an admin session), pastes
codes and reads each verdict; an admin opens any show's gate; the CSV link; stale forms."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from dueflow.api.app import create_app
from dueflow.service import accounts, orders, payments
from dueflow.store import schema
from tests.unit.api.test_admin_pages import csrf_of, log_in


@pytest.fixture
async def app(world):
    return create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        yield client


async def organizer(world, name: str = "ada") -> tuple[int, str]:
    user, token = await accounts.add_user(world.deps, name)
    return user.id, token


async def sold(world, show_id: int, seat: str) -> str:
    """A ticket of ``seat``, bought by the world's buyer and paid: its code."""
    order = await world.seats(show_id, [seat])
    price = "380.00" if seat.startswith("A") else "180.00"
    await payments.record_manual_payment(world.deps, order_id=order["id"], amount=price)
    return str((await orders.order_view(world.deps, order["id"]))["tickets"][0]["code"])


def verdicts(html: str) -> list[tuple[str, str]]:
    """(kind, headline) of each verdict drawn, in order."""
    return re.findall(r'<div class="verdict v-([a-z_]+)" role="status">\s*<strong>([^<]+)<', html)


async def sign_in(client: httpx.AsyncClient, show_id: int, token: str) -> str:
    """Sign in at the show's gate; returns the gate page's CSRF token."""
    answer = await client.post(f"/admin/shows/{show_id}/gate/login", data={"token": token})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == f"/admin/shows/{show_id}/gate"
    page = await client.get(answer.headers["location"])
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


async def test_an_organizer_checks_codes_in_at_their_own_shows_gate(app, client, world):
    ada, token = await organizer(world)
    show_id = await world.show("A:1-4", organizer=ada)
    first, second = await sold(world, show_id, "A-1"), await sold(world, show_id, "A-2")
    page = await client.get(f"/admin/shows/{show_id}/gate")
    assert page.status_code == 200 and "Gate sign in" in page.text  # not signed in yet
    csrf = await sign_in(client, show_id, token)
    pasted = f"{first}\n\n  {first}  \r\nnot-a-code\n{second}\n"
    answer = await client.post(
        f"/admin/shows/{show_id}/gate", data={"csrf": csrf, "codes": pasted, "gate": "North"}
    )
    assert answer.status_code == 200, answer.text
    assert verdicts(answer.text) == [
        ("valid", "Valid"),
        ("checked_in", "Checked in already"),
        ("unknown", "Unknown code"),
        ("valid", "Valid"),
    ]
    assert "seat A-1 · buyer" in answer.text and "at gate North" in answer.text
    assert re.search(r"<b>2</b> of <b>2</b> checked in", answer.text)
    assert 'value="North"' in answer.text  # the gate stays for the next codes
    async with world.deps.db.read() as conn:
        gates = (await conn.execute(select(schema.tickets.c.checked_in_gate))).scalars().all()
    assert gates == ["North", "North"]
    # The order's page (an admin's) says when and where each ticket was let in.
    async with world.deps.db.read() as conn:
        order_id = (await conn.execute(select(schema.tickets.c.order_id))).scalars().first()
    _, root = await accounts.add_user(world.deps, "root", admin=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
    ) as operator:
        await log_in(operator, root)
        order_page = await operator.get(f"/admin/orders/{order_id}")
    assert "2026-03-01 12:00:00 at gate North" in order_page.text
    csv = await client.get(f"/admin/shows/{show_id}/tickets.csv")
    assert csv.status_code == 200 and csv.text.startswith("seat,code,buyer,state")
    assert csv.text.count(",North") == 2


async def test_a_gate_session_opens_nothing_else(client, world):
    ada, token = await organizer(world)
    mine = await world.show("A:1-2", organizer=ada)
    others = await world.show("A:1-2")  # the world's seller's
    code = await sold(world, others, "A-1")
    csrf = await sign_in(client, mine, token)
    for path in (f"/admin/shows/{others}/gate", f"/admin/shows/{others}/tickets.csv"):
        assert (await client.get(path)).status_code == 404
    refused = await client.post(
        f"/admin/shows/{others}/gate", data={"csrf": csrf, "codes": code, "gate": ""}
    )
    assert refused.status_code == 404
    # A ticket of another show pasted at my gate: unknown, and not checked in.
    answer = await client.post(
        f"/admin/shows/{mine}/gate", data={"csrf": csrf, "codes": code, "gate": ""}
    )
    assert verdicts(answer.text) == [("unknown", "Unknown code")]
    # The admin pages stay shut: the gate cookie is for /admin/shows and signed for the gate.
    for path in ("/admin", f"/admin/shows/{mine}"):
        assert (await client.get(path)).status_code == 303
    gate_cookie = client.cookies.get("dueflow_gate")
    client.cookies.set("dueflow_admin", gate_cookie)
    assert (await client.get("/admin")).status_code == 303
    async with world.deps.db.read() as conn:
        assert (await conn.execute(select(schema.tickets.c.checked_in_at))).scalars().all() == [
            None
        ]


async def test_an_admin_opens_any_gate_and_refusals(client, world):
    _, root = await accounts.add_user(world.deps, "root", admin=True)
    show_id = await world.show("A:1-2")
    code = await sold(world, show_id, "A-2")
    bad = await client.post(f"/admin/shows/{show_id}/gate/login", data={"token": "nope"})
    assert bad.status_code == 401
    await log_in(client, root)
    page = await client.get(f"/admin/shows/{show_id}/gate")
    assert page.status_code == 200 and "Log out root" in page.text
    csrf = csrf_of(page.text)
    stale = await client.post(f"/admin/shows/{show_id}/gate", data={"codes": code})
    assert stale.status_code == 403
    too_long = await client.post(
        f"/admin/shows/{show_id}/gate", data={"csrf": csrf, "codes": code, "gate": "g" * 41}
    )
    assert too_long.status_code == 422 and "at most 40" in too_long.text
    many = "\n".join(["x"] * 51)
    assert (
        await client.post(f"/admin/shows/{show_id}/gate", data={"csrf": csrf, "codes": many})
    ).status_code == 422
    answer = await client.post(f"/admin/shows/{show_id}/gate", data={"csrf": csrf, "codes": code})
    assert verdicts(answer.text) == [("valid", "Valid")]
    show_page = await client.get(f"/admin/shows/{show_id}")
    assert f'href="/admin/shows/{show_id}/tickets.csv"' in show_page.text
    assert f'href="/admin/shows/{show_id}/gate"' in show_page.text
    assert (await client.get("/admin/shows/999/gate")).status_code == 404
