"""The order's own buyer asking for the seller's action (or the reverse) is told 403
``not_your_role`` naming the role it needs; a stranger still learns nothing (404, exactly as for a
missing order); an admin who is no party gets 403 ``not_allowed``. Nothing changes in any case."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.api import Api, FakePay, running_api, table_snapshot


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


@dataclass
class RoleRoute:
    """A route only one party may call, the state it is called in, and who may call it."""

    path: str
    setup: str  # the Api method that makes the order
    needed: str  # "buyer" or "seller"
    body: dict[str, Any] | None = None

    @property
    def other(self) -> str:
        return "seller" if self.needed == "buyer" else "buyer"


ROLE_ROUTES = {
    "pay": RoleRoute("/api/orders/{id}/payments", "order", "buyer", {"provider": "fakepay"}),
    "ship": RoleRoute(
        "/api/orders/{id}/ship", "paid_order", "seller", {"carrier": "SF", "tracking_no": "SF1"}
    ),
    "confirm receipt": RoleRoute("/api/orders/{id}/confirm-receipt", "shipped", "buyer"),
}


@pytest.mark.parametrize("name", list(ROLE_ROUTES))
async def test_the_other_party_is_told_the_role_it_needs(api, name):
    route = ROLE_ROUTES[name]
    order_id = await getattr(api, route.setup)()
    path = route.path.format(id=order_id)
    before = await table_snapshot(api.deps)
    answer = await api.call("POST", path, route.other, json=route.body)
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "not_your_role"
    assert f"only the {route.needed} of order {order_id}" in error["message"]
    assert f"you are its {route.other}" in error["message"]
    assert await table_snapshot(api.deps) == before
    # the party it is for still may
    done = await api.call("POST", path, route.needed, json=route.body)
    assert done.status_code in (200, 201), done.text


@pytest.mark.parametrize("name", list(ROLE_ROUTES))
async def test_a_stranger_still_sees_no_such_order(api, name):
    route = ROLE_ROUTES[name]
    order_id = await getattr(api, route.setup)()
    before = await table_snapshot(api.deps)
    hidden = await api.call("POST", route.path.format(id=order_id), "stranger", json=route.body)
    missing = await api.call("POST", route.path.format(id=999_999), "stranger", json=route.body)
    assert hidden.status_code == missing.status_code == 404
    expected = {"code": "not_found", "message": f"no order {order_id}", "field": None}
    assert hidden.json() == {"error": expected}
    assert missing.json()["error"]["code"] == "not_found"
    assert await table_snapshot(api.deps) == before


@pytest.mark.parametrize("name", list(ROLE_ROUTES))
async def test_an_admin_who_is_no_party_is_not_allowed(api, name):
    route = ROLE_ROUTES[name]
    order_id = await getattr(api, route.setup)()
    before = await table_snapshot(api.deps)
    answer = await api.call("POST", route.path.format(id=order_id), "admin", json=route.body)
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "not_allowed"
    assert await table_snapshot(api.deps) == before


async def test_routes_both_parties_may_call_answer_each_by_role(api):
    """Cancel and review have no wrong party: each party's own action is chosen (and refused by
    the order's status, 409, not by role)."""
    unpaid = await api.order()
    answer = await api.call("POST", f"/api/orders/{unpaid}/cancel", "seller")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "invalid_transition"
    received = await api.received()
    for who in ("buyer", "seller"):
        review = await api.call(
            "POST", f"/api/orders/{received}/reviews", who, json={"rating": 5, "comment": ""}
        )
        assert review.status_code == 201
        assert review.json()["role"] == who


async def test_the_services_raise_not_your_role_for_the_other_party_only(world):
    """The command line calls the services directly: the same distinction reaches it."""
    from dueflow.exceptions import NotAllowed, NotYourRole
    from dueflow.payments.base import Providers
    from dueflow.payments.manual import ManualProvider
    from dueflow.service import orders, payments

    world.deps.providers = Providers([ManualProvider(), FakePay()])
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    with pytest.raises(NotYourRole, match="only the buyer"):
        await payments.start_payment(
            world.deps, order_id=order_id, user_id=world.seller, provider="fakepay"
        )
    with pytest.raises(NotYourRole, match="only the buyer"):
        await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.seller)
    with pytest.raises(NotYourRole, match="only the seller"):
        await orders.ship(
            world.deps, order_id=order_id, user_id=world.buyer, carrier="SF", tracking_no="1"
        )
    with pytest.raises(NotAllowed) as stranger:
        await orders.ship(
            world.deps, order_id=order_id, user_id=world.other, carrier="SF", tracking_no="1"
        )
    assert type(stranger.value) is NotAllowed
