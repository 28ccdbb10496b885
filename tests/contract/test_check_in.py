"""The door of a show on SQLite, PostgreSQL and MariaDB: each verdict of
``POST /api/tickets/{code}/check-in`` through the whole API (valid, checked in already, void,
unknown; a stranger told exactly what an unknown code is told), who may (the organizer's token,
a key with ``catalog`` acting for them, an admin), a repeat with the same Idempotency-Key, the
CSV of a show's tickets, and N scans of one code at once over real connections (exactly one is
let in). Every assertion on what was let in reads the database."""

from __future__ import annotations

import asyncio
import csv
import io
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from dueflow.exceptions import TicketCheckedIn
from dueflow.service import checkin
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import schema
from tests.conftest import START
from tests.contract.race_harness import race, rows
from tests.unit.api import Api, running_api
from tests.unit.api.shop_world import fails
from tests.unit.test_statement_counts import Counting, Sent


@pytest.fixture
async def api(backend_world: Any) -> AsyncIterator[Api]:
    async with running_api(backend_world.deps) as found:
        found.world = backend_world  # type: ignore[attr-defined]
        yield found


def check_in(api: Api, code: str, who: str | None, gate: str | None = "North", **kwargs: Any):
    body = {} if gate is None else {"gate": gate}
    return api.call("POST", f"/api/tickets/{code}/check-in", who, json=body, **kwargs)


async def door_rows(deps: Deps, code: str) -> list[tuple[Any, ...]]:
    query = select(
        schema.tickets.c.checked_in_at,
        schema.tickets.c.checked_in_gate,
        schema.tickets.c.checked_in_by,
    ).where(schema.tickets.c.code == code)
    return [tuple(r) for r in await rows(deps, query)]


async def events_of(deps: Deps, event: str) -> list[Any]:
    query = select(schema.order_events).where(schema.order_events.c.event == event)
    return await rows(deps, query)


async def test_each_verdict(api):
    show_id = await api.show()
    code = await api.paid_ticket(show_id, "A-1")
    let_in = await check_in(api, code, "seller")
    assert let_in.status_code == 200, let_in.text
    ticket = let_in.json()
    assert ticket == {
        "code": code,
        "show_id": show_id,
        "order_id": ticket["order_id"],
        "seat": "A-1",
        "buyer": "api-buyer",
        "state": "valid",
        "checked_in_at": START.isoformat(),
        "gate": "North",
    }
    seller = f"user:{api.ids['seller']}"
    assert await door_rows(api.deps, code) == [(START, "North", seller)]
    (event,) = await events_of(api.deps, "ticket_checked_in")
    assert (event.order_id, event.actor) == (ticket["order_id"], seller)

    # Scanned again (another gate, later): refused, saying when and where it was let in.
    api.world.clock.advance(timedelta(minutes=5))
    again = await check_in(api, code, "seller", gate="South")
    fails(again, 409, "ticket_checked_in", f"at {START.isoformat()} at gate North (seat A-1)")
    assert set(again.json()) == {"error"}
    assert await door_rows(api.deps, code) == [(START, "North", seller)]
    assert len(await events_of(api.deps, "ticket_checked_in")) == 1

    # Unknown, and a stranger's or the buyer's scan of a real code: the same 404.
    unknown = await check_in(api, "no-such-code", "seller")
    fails(unknown, 404, "not_found")
    other = await api.paid_ticket(show_id, "A-2")
    for who in ("stranger", "buyer"):
        refused = await check_in(api, other, who)
        fails(refused, 404, "not_found")
        assert refused.json() == unknown.json()
    assert await door_rows(api.deps, other) == [(None, None, None)]

    # An admin may check in at any show's door; no gate named is null.
    admitted = await check_in(api, other, "admin", gate=None)
    assert admitted.status_code == 200, admitted.text
    assert admitted.json()["gate"] is None
    admin = f"user:{api.ids['admin']}"
    later = START + timedelta(minutes=5)
    assert await door_rows(api.deps, other) == [(later, None, admin)]


async def test_a_cancelled_show_voids_its_tickets_at_once(api):
    show_id = await api.show()
    code = await api.paid_ticket(show_id, "B-1")
    assert (await api.call("POST", f"/api/shows/{show_id}/cancel", "seller")).is_success
    # The worker has not cancelled the order yet: the show's status already says void.
    fails(await check_in(api, code, "seller"), 409, "ticket_void", "cancelled")
    await api.world.worker.drain()
    fails(await check_in(api, code, "seller"), 409, "ticket_void", "cancelled")
    assert await door_rows(api.deps, code) == [(None, None, None)]
    # A stranger still learns nothing.
    fails(await check_in(api, code, "stranger"), 404, "not_found")


async def test_a_void_ticket_of_a_cancelled_order(api):
    show_id = await api.show()
    code = await api.paid_ticket(show_id, "B-2")
    async with api.deps.db.write() as conn:  # as the worker leaves an order of a cancelled show
        await conn.execute(
            update(schema.tickets).where(schema.tickets.c.code == code).values(state="void")
        )
    fails(await check_in(api, code, "seller"), 409, "ticket_void", "order")


async def test_bad_gates_and_codes(api):
    code = await api.paid_ticket(await api.show(), "A-3")
    fails(await check_in(api, code, "seller", gate="x" * 41), 422, "invalid_input")
    fails(await check_in(api, code, "seller", gate="a\x00b"), 422, "invalid_input")
    fails(await check_in(api, "x" * 65, "seller"), 422, "invalid_input")
    fails(await check_in(api, "a b", "seller"), 404, "not_found")
    assert await door_rows(api.deps, code) == [(None, None, None)]


async def test_scopes_and_keys_acting_for_the_organizer(api):
    show_id = await api.show()
    code = await api.paid_ticket(show_id, "A-1")
    wrong_scope = await api.as_key("orders", "seller")
    fails(await check_in(api, code, None, headers=wrong_scope), 403, "missing_scope", "catalog")
    for_nobody = {"Authorization": f"Bearer {await api.service_key('catalog')}"}
    fails(await check_in(api, code, None, headers=for_nobody), 400, "act_as_required")
    for_stranger = await api.as_key("catalog", "stranger")
    fails(await check_in(api, code, None, headers=for_stranger), 404, "not_found")
    fails(await check_in(api, code, None), 401, "unauthorized")
    assert await door_rows(api.deps, code) == [(None, None, None)]
    for_seller = await api.as_key("catalog", "seller")
    let_in = await check_in(api, code, None, headers=for_seller)
    assert let_in.status_code == 200, let_in.text
    ((_, _, by),) = await door_rows(api.deps, code)
    assert by.startswith(f"user:{api.ids['seller']}@key:")


async def test_a_repeat_with_its_key_is_the_same_200_and_a_scan_without_one_a_409(api):
    code = await api.paid_ticket(await api.show(), "A-2")
    keyed = {"Idempotency-Key": "door-1"}
    first = await check_in(api, code, "seller", headers=keyed)
    assert first.status_code == 200, first.text
    repeat = await check_in(api, code, "seller", headers=keyed)
    assert (repeat.status_code, repeat.content) == (200, first.content)
    assert repeat.headers["Idempotent-Replayed"] == "true"
    fails(await check_in(api, code, "seller"), 409, "ticket_checked_in")
    fails(
        await check_in(api, code, "seller", headers={"Idempotency-Key": "door-2"}),
        409,
        "ticket_checked_in",
    )
    assert len(await events_of(api.deps, "ticket_checked_in")) == 1


async def test_the_csv_of_a_shows_tickets(api):
    show_id = await api.show()
    await api.paid_ticket(show_id, "B-1")
    sly = await api.paid_ticket(show_id, "A-1", who="stranger")
    async with api.deps.db.write() as conn:  # a buyer may name themselves like a formula
        await conn.execute(
            update(schema.users)
            .where(schema.users.c.id == api.ids["stranger"])
            .values(name="=HYPERLINK(1)")
        )
    assert (await check_in(api, sly, "seller", gate="Gate, 2")).is_success
    answer = await api.call("GET", f"/api/shows/{show_id}/tickets.csv", "seller")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/csv; charset=utf-8"
    assert f"show-{show_id}-tickets.csv" in answer.headers["content-disposition"]
    found = list(csv.reader(io.StringIO(answer.text)))
    assert found[0] == ["seat", "code", "buyer", "state", "checked_in_at", "gate"]
    codes = {r[0]: r[1] for r in found[1:]}
    assert [r[:1] + r[2:] for r in found[1:]] == [
        ["A-1", "'=HYPERLINK(1)", "valid", START.isoformat(), "Gate, 2"],
        ["B-1", "api-buyer", "valid", "", ""],
    ]
    assert codes["A-1"] == sly
    admin = await api.call("GET", f"/api/shows/{show_id}/tickets.csv", "admin")
    assert admin.text == answer.text
    fails(await api.call("GET", f"/api/shows/{show_id}/tickets.csv", "stranger"), 404, "not_found")
    fails(await api.call("GET", "/api/shows/999999/tickets.csv", "seller"), 404, "not_found")


def scanning(code: str, organizer: User, gate: str):
    async def body(deps: Deps) -> dict[str, Any]:
        return await checkin.check_in(deps, code, user=organizer, gate=gate)

    return body


async def test_many_scans_of_one_code_at_once_let_it_in_once(api, backend_url):
    code = await api.paid_ticket(await api.show(), "A-3")
    organizer = User(api.ids["seller"], "api-seller", False)
    scans = [scanning(code, organizer, f"G{n}") for n in range(24)]
    outcomes = await asyncio.to_thread(race, backend_url, START, scans, processes=4)
    let_in = [o.value for o in outcomes if o.error is None]
    refused = [o.error for o in outcomes if o.error is not None]
    assert len(let_in) == 1, outcomes
    assert Counter(type(e) for e in refused) == {TicketCheckedIn: 23}, refused
    gate = let_in[0]["gate"]
    assert all(e.gate == gate and e.checked_in_at == START for e in refused)
    assert await door_rows(api.deps, code) == [(START, gate, f"user:{organizer.id}")]
    assert len(await events_of(api.deps, "ticket_checked_in")) == 1


async def test_a_check_in_sends_its_pinned_statements(api):
    """The caller's token (1); the UPDATE (1) and the ticket read for the answer (1); the
    order's event (1) and its snapshot (the order, its lines, tickets, payments, refunds: 5, and
    the UPDATE writing it: 1). A refusal: the UPDATE and the read that says why."""
    show_id = await api.show()
    codes = [await api.paid_ticket(show_id, seat) for seat in ("A-1", "A-2")]
    counting = Counting(api)
    try:
        found = []
        for code in codes:  # the second one is counted: statements compiled by then
            _, sent = await counting(check_in(api, code, "seller"))
            found.append(sent.counts())
        counting.sent = Sent()
        refused = await check_in(api, codes[0], "seller")
        fails(refused, 409, "ticket_checked_in")
        found.append(counting.sent.counts())
    finally:
        counting.close()
    assert found[1:] == [(10, 2, 1), (3, 2, 1)], sent.statements
