"""The catalogue's lists over HTTP (GET /api/skus, /api/shows, /api/flash-sales,
/api/coupon-templates), the caller's coupons (GET /api/me/coupons), the refunds
(GET /api/admin/refunds) and the users (GET /api/admin/users), on every database: a walk shows
every row once, newest first; filters; limits and bad cursors refused (422 invalid_input,
nothing changed); who sees what, as the single reads decide; the coupons' and refunds' answers
still what their clients read before the lists had pages.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import update

from dueflow.service import lists
from dueflow.store import schema
from tests.unit.api import Api, running_api, table_snapshot
from tests.unit.api.test_lists import flat, forged, walk


@pytest.fixture
async def api(backend_world) -> AsyncIterator[Api]:
    async with running_api(backend_world.deps) as api:
        yield api


# --- the catalogue --------------------------------------------------------------------------


async def test_every_user_walks_every_sku_once_newest_first_and_by_seller(api):
    mine = [await api.sku() for _ in range(5)]
    theirs = [await api.sku(who="stranger") for _ in range(2)]
    everything = sorted(mine + theirs, reverse=True)
    for who in ("buyer", "stranger", "seller", "admin"):
        pages = await walk(api, who, "/api/skus", limit=3)
        assert flat(pages) == everything and [len(p) for p in pages] == [3, 3, 1]
    by_seller = await walk(api, "stranger", "/api/skus", seller_id=api.ids["seller"], limit=2)
    assert flat(by_seller) == sorted(mine, reverse=True)
    [item] = (await api.call("GET", "/api/skus", "buyer", params={"limit": 1})).json()["items"]
    single = await api.call("GET", f"/api/skus/{item['id']}", "buyer")
    assert item == single.json()  # an item is what the single read shows


async def test_shows_by_status_and_organizer_each_without_seat_counts(api):
    shows = [await api.show() for _ in range(3)]
    cancelled = await api.call("POST", f"/api/shows/{shows[0]}/cancel", "seller")
    assert cancelled.status_code == 200, cancelled.text
    on_sale = await walk(api, "stranger", "/api/shows", status="on_sale", limit=1)
    gone = await walk(api, "stranger", "/api/shows", status="cancelled")
    of_seller = await walk(api, "buyer", "/api/shows", organizer_id=api.ids["seller"], limit=2)
    of_buyer = await walk(api, "buyer", "/api/shows", organizer_id=api.ids["buyer"])
    assert flat(on_sale) == sorted(shows[1:], reverse=True)
    assert flat(gone) == [shows[0]]
    assert flat(of_seller) == sorted(shows, reverse=True) and flat(of_buyer) == []
    items = (await api.call("GET", "/api/shows", "buyer")).json()["items"]
    single = (await api.call("GET", f"/api/shows/{shows[2]}", "buyer")).json()
    del single["seats"]
    assert items[0] == single and items[0]["sales"] == "open"
    assert [i["sales"] for i in items] == ["open", "open", "cancelled"]


async def test_flash_sales_by_sku_and_seller(api):
    sku = await api.sku(stock=50)
    of_sku = [await api.flash_sale(sku) for _ in range(3)]
    other = await api.flash_sale()
    assert flat(await walk(api, "stranger", "/api/flash-sales", sku_id=sku, limit=2)) == sorted(
        of_sku, reverse=True
    )
    every = await walk(api, "buyer", "/api/flash-sales", seller_id=api.ids["seller"])
    assert flat(every) == sorted([*of_sku, other], reverse=True)
    both = await walk(api, "buyer", "/api/flash-sales", seller_id=api.ids["buyer"], sku_id=sku)
    assert flat(both) == []
    [item] = (await api.call("GET", "/api/flash-sales", "buyer", params={"limit": 1})).json()[
        "items"
    ]
    assert item == (await api.call("GET", f"/api/flash-sales/{other}", "buyer")).json()


async def test_coupon_templates_by_seller(api):
    templates = [await api.coupon_template() for _ in range(3)]
    pages = await walk(api, "stranger", "/api/coupon-templates", limit=2)
    assert flat(pages) == sorted(templates, reverse=True)
    none = await walk(api, "seller", "/api/coupon-templates", seller_id=api.ids["stranger"])
    assert flat(none) == []
    [item] = (await api.call("GET", "/api/coupon-templates", "buyer", params={"limit": 1})).json()[
        "items"
    ]
    assert item == (await api.call("GET", f"/api/coupon-templates/{templates[-1]}", "buyer")).json()


# --- a user's coupons -----------------------------------------------------------------------


async def test_coupons_are_only_ever_the_callers_own_and_keep_their_old_key(api):
    buyers = [await api.coupon("buyer") for _ in range(5)]
    strangers = [await api.coupon("stranger") for _ in range(2)]
    pages = await walk_coupons(api, "buyer", limit=2)
    assert flat(pages) == sorted(buyers, reverse=True)
    assert flat(await walk_coupons(api, "stranger")) == sorted(strangers, reverse=True)
    assert flat(await walk_coupons(api, "seller")) == []  # the issuer holds none of them
    # A client written before the pages: one request, the coupons under "coupons" (100 a page).
    old = (await api.call("GET", "/api/me/coupons", "buyer")).json()
    assert [c["id"] for c in old["coupons"]] == sorted(buyers, reverse=True)
    assert old["items"] == old["coupons"] and old["next"] is None
    # Someone else's cursor is refused, not a way into their coupons.
    theirs = (await api.call("GET", "/api/me/coupons", "stranger", params={"limit": 1})).json()
    refused = await api.call("GET", "/api/me/coupons", "buyer", params={"after": theirs["next"]})
    assert refused.status_code == 422
    assert "made for other filters" in refused.json()["error"]["message"]


async def walk_coupons(api: Api, who: str, **params: Any) -> list[list[int]]:
    pages: list[list[int]] = []
    after = None
    while True:
        query = {**params, **({"after": after} if after else {})}
        answer = await api.call("GET", "/api/me/coupons", who, params=query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == {"items", "next", "coupons"} and body["coupons"] == body["items"]
        pages.append([c["id"] for c in body["items"]])
        after = body["next"]
        if after is None:
            return pages


# --- the admins' lists ----------------------------------------------------------------------


async def test_refunds_are_walked_by_the_link_header_their_body_still_a_list(api):
    refunds = [await api.refund() for _ in range(5)]
    failed = refunds[1]
    async with api.deps.db.write() as conn:
        await conn.execute(
            update(schema.refunds).where(schema.refunds.c.id == failed).values(state="failed")
        )
    seen: list[list[int]] = []
    url: str | None = "/api/admin/refunds?limit=2"
    while url is not None:
        answer = await api.call("GET", url, "admin")
        assert answer.status_code == 200, answer.text
        assert isinstance(answer.json(), list)
        seen.append([r["id"] for r in answer.json()])
        link = answer.headers.get("link")
        url = None if link is None else re.fullmatch(r'<([^>]+)>; rel="next"', link).group(1)
    assert flat(seen) == sorted(refunds, reverse=True) and [len(p) for p in seen] == [2, 2, 1]
    pending = await api.call("GET", "/api/admin/refunds?state=pending_review&limit=10", "admin")
    assert [r["id"] for r in pending.json()] == sorted(set(refunds) - {failed}, reverse=True)
    assert "link" not in pending.headers
    # As before: a state, up to 1000 a page.
    old = await api.call("GET", "/api/admin/refunds?state=failed&limit=1000", "admin")
    assert [r["id"] for r in old.json()] == [failed]
    first = await api.call("GET", "/api/admin/refunds?limit=1&state=pending_review", "admin")
    assert "state=pending_review" in first.headers["link"]


async def test_an_admin_walks_every_user_once_newest_first(api):
    pages = await walk(api, "admin", "/api/admin/users", limit=3)
    walked = flat(pages)
    assert walked == sorted(set(walked), reverse=True)  # each once, newest first
    assert walked[:4] == sorted(api.ids.values(), reverse=True)  # the API's, made last
    assert len(walked) == 4 + 3  # and the world's seller, buyer and other
    answer = (await api.call("GET", "/api/admin/users", "admin", params={"limit": 100})).json()
    admin = next(u for u in answer["items"] if u["id"] == api.ids["admin"])
    assert admin == {
        "id": api.ids["admin"],
        "name": "api-admin",
        "admin": True,
        "created_at": admin["created_at"],
    }


async def test_the_admins_lists_refuse_everyone_else_and_change_nothing(api):
    await api.refund()
    before = await table_snapshot(api.deps)
    for path in ("/api/admin/users", "/api/admin/refunds"):
        for who, status in (("buyer", 403), ("seller", 403), ("stranger", 403), (None, 401)):
            answer = await api.call("GET", path, who)
            assert answer.status_code == status, (path, who, answer.text)
            assert list(answer.json()) == ["error"], (path, who, answer.text)
    assert await table_snapshot(api.deps) == before


# --- limits and cursors ---------------------------------------------------------------------

PAGED = [
    "/api/skus",
    "/api/shows",
    "/api/flash-sales",
    "/api/coupon-templates",
    "/api/me/coupons",
    "/api/admin/users",
    "/api/admin/refunds",
]


async def test_bad_limits_and_cursors_are_refused_without_changing_a_row(api):
    await api.flash_sale(await api.sku())
    await api.sku()
    await api.show()
    await api.show()
    await api.coupon()
    await api.refund()
    sku_next = (await api.call("GET", "/api/skus", "admin", params={"limit": 1})).json()["next"]
    show_next = (
        await api.call("GET", "/api/shows", "admin", params={"limit": 1, "status": "on_sale"})
    ).json()["next"]
    scope = {"list": "skus", "seller_id": None}
    not_cursors = [
        "!!!",
        "x" * 401,
        "abc",
        forged(b"{not json"),
        forged({"after": 0, "for": scope}),
        forged({"after": 2**63, "for": scope}),
        forged({"after": "2", "for": scope}),
    ]
    other_filters = [
        ("/api/shows", {"after": sku_next}),  # a SKU cursor for shows
        ("/api/skus", {"after": sku_next, "seller_id": api.ids["seller"]}),
        ("/api/shows", {"after": show_next}),  # made for on_sale, used for every status
        ("/api/flash-sales", {"after": sku_next}),
        ("/api/coupon-templates", {"after": sku_next}),
        ("/api/me/coupons", {"after": sku_next}),
        ("/api/admin/users", {"after": sku_next}),
        ("/api/admin/refunds", {"after": sku_next}),
    ]
    limits = {path: ("0", "-1", "many", "1.5", "101") for path in PAGED}
    limits["/api/admin/refunds"] = ("0", "-1", "many", "1001")  # it kept its 1000
    before = await table_snapshot(api.deps)
    for path in PAGED:
        for bad in not_cursors:
            answer = await api.call("GET", path, "admin", params={"after": bad})
            assert answer.status_code == 422, (path, bad, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input"
        for limit in limits[path]:
            answer = await api.call("GET", path, "admin", params={"limit": limit})
            assert answer.status_code == 422, (path, limit, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input"
    for path, params in other_filters:
        answer = await api.call("GET", path, "admin", params=params)
        assert answer.status_code == 422, (path, params, answer.text)
        assert "made for other filters" in answer.json()["error"]["message"]
    for path, params in (
        ("/api/shows", {"status": "sold_out"}),
        ("/api/skus", {"seller_id": 0}),
        ("/api/flash-sales", {"sku_id": "x"}),
        ("/api/admin/refunds", {"state": "lost"}),
    ):
        answer = await api.call("GET", path, "admin", params=params)
        assert answer.status_code == 422, (path, params, answer.text)
        assert answer.json()["error"]["code"] == "invalid_input"
    assert await table_snapshot(api.deps) == before
    # The same cursors, as given, are good; a SKU cursor is anyone's (it is a position).
    for path, params in (
        ("/api/skus", {"after": sku_next}),
        ("/api/shows", {"after": show_next, "status": "on_sale"}),
    ):
        answer = await api.call("GET", path, "stranger", params=params)
        assert answer.status_code == 200, answer.text


async def test_the_default_page_is_twenty(api):
    for _ in range(lists.DEFAULT_LIMIT + 1):
        await api.sku()
    page = (await api.call("GET", "/api/skus", "buyer")).json()
    assert len(page["items"]) == 20 and page["next"] is not None
