"""Control characters, lone surrogates and noncharacters in free text are refused at the edge:
422 naming the field, no row changed (issue 9, item 7). The same rule holds for the admin forms
and the command line."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from dueflow import cli
from dueflow.domain import text
from dueflow.service import accounts
from tests.conftest import table_snapshot
from tests.unit.api import Api, running_api

#: One character of each refused kind.
REFUSED = {
    "NUL": "\x00",
    "BEL": "\x07",
    "ESC": "\x1b",
    "DEL": "\x7f",
    "C1 NEL": "\x85",
    "C1 CSI": "\x9b",
    "lone high surrogate": "\ud800",
    "lone low surrogate": "\udfff",
    "U+FFFE": "\ufffe",
    "U+FFFF": "\uffff",
    "U+FDD0": "\ufdd0",
    "U+10FFFF": "\U0010ffff",
}
#: Refused in one-line text, kept in a comment.
LINE_BREAKS = {"tab": "\t", "line feed": "\n", "carriage return": "\r"}
#: Text people write, kept everywhere.
FINE = ["风筝 kite", "emoji 👩‍👩‍👧 and ✈️", "שלום \u200f mark", "café\u0301", "a\u00a0b"]


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


def raw_json(body: dict[str, Any]) -> bytes:
    """JSON with non-ASCII escaped, so a lone surrogate goes over the wire as ``\\ud800``."""
    return json.dumps(body, ensure_ascii=True).encode()


async def post(api: Api, path: str, who: str, body: dict[str, Any]) -> Any:
    headers = {"Content-Type": "application/json"}
    return await api.call("POST", path, who, content=raw_json(body), headers=headers)


def assert_refused(answer: Any, field: str) -> None:
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_input"
    assert f"body.{field}:" in error["message"], error["message"]


@pytest.mark.parametrize("kind", [*REFUSED, *LINE_BREAKS])
def test_one_line_text_refuses_every_kind(kind):
    bad = {**REFUSED, **LINE_BREAKS}[kind]
    assert text.refused_character(f"kite{bad}") is not None
    with pytest.raises(ValueError, match="U\\+"):
        text.checked(f"kite{bad}")


@pytest.mark.parametrize("kind", REFUSED)
def test_multi_line_text_refuses_the_same_but_line_breaks(kind):
    assert text.refused_character(f"fine\n{REFUSED[kind]}", multiline=True) is not None
    assert text.refused_character("line one\r\n\tline two\n", multiline=True) is None


@pytest.mark.parametrize("value", FINE)
def test_text_people_write_is_kept(value):
    assert text.checked(value) == value
    assert text.checked(value, multiline=True) == value


def test_the_message_names_the_character_and_where():
    assert text.refused_character("ab\x00") == (
        "contains the control character U+0000 at position 3"
    )
    assert text.refused_character("a\ud800") == "contains a lone surrogate U+D800 at position 2"


@pytest.mark.parametrize("kind", REFUSED)
async def test_every_free_text_field_refuses_bad_text_without_changing_a_row(api, kind):
    bad = f"x{REFUSED[kind]}y"
    order_id = await api.order()
    shipped = await api.shipped()
    received = await api.received()
    now = api.deps.clock.now()
    template = {
        "title": bad,
        "amount_off": "1.00",
        "valid_from": now.isoformat(),
        "valid_until": (now + timedelta(days=1)).isoformat(),
        "total": 1,
    }
    before = await table_snapshot(api.deps)
    calls = [
        ("/api/goods", "seller", {"title": bad, "price": "1.00"}, "title"),
        ("/api/skus", "seller", {"title": bad, "price": "1.00", "stock": 1}, "title"),
        ("/api/coupon-templates", "seller", template, "title"),
        (f"/api/orders/{order_id}/payments", "buyer", {"provider": bad}, "provider"),
        (
            f"/api/orders/{shipped}/ship",
            "seller",
            {"carrier": bad, "tracking_no": "1"},
            "carrier",
        ),
        (
            f"/api/orders/{shipped}/ship",
            "seller",
            {"carrier": "SF", "tracking_no": bad},
            "tracking_no",
        ),
        (f"/api/orders/{received}/reviews", "buyer", {"rating": 5, "comment": bad}, "comment"),
        ("/api/admin/users", "admin", {"name": bad}, "name"),
    ]
    for path, who, body, field in calls:
        answer = await post(api, path, who, body)
        assert_refused(answer, field)
        if kind == "NUL":
            assert "U+0000 at position 2" in answer.json()["error"]["message"]
    assert await table_snapshot(api.deps) == before


#: The bodies of what has a title, but the title.
TITLED = {
    "/api/goods": {"price": "1.00"},
    "/api/skus": {"price": "1.00", "stock": 1},
    "/api/coupon-templates": {
        "amount_off": "1.00",
        "valid_from": "2026-03-01T00:00:00+00:00",
        "valid_until": "2026-04-01T00:00:00+00:00",
        "total": 1,
    },
}


@pytest.mark.parametrize("kind", LINE_BREAKS)
async def test_a_title_is_one_line_but_a_comment_may_have_several(api, kind):
    before = await table_snapshot(api.deps)
    title = f"a{LINE_BREAKS[kind]}b"
    for path, body in TITLED.items():
        answer = await post(api, path, "seller", {**body, "title": title})
        assert_refused(answer, "title")
    assert await table_snapshot(api.deps) == before
    order_id = await api.received()
    comment = f"good{LINE_BREAKS[kind]}kite"
    answer = await post(
        api, f"/api/orders/{order_id}/reviews", "buyer", {"rating": 5, "comment": comment}
    )
    assert answer.status_code == 201, answer.text
    [review] = answer.json()["order"]["reviews"]
    assert review["comment"] == comment


@pytest.mark.parametrize("value", FINE)
async def test_titles_people_write_are_kept(api, value):
    for path, body in TITLED.items():
        answer = await post(api, path, "seller", {**body, "title": value})
        assert answer.status_code == 201, answer.text
        assert answer.json()["title"] == value


@pytest.fixture
def cli_env(monkeypatch, settings, world):
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DUEFLOW_PROFILE", "prod")


def test_the_command_line_refuses_a_control_character_in_a_title(cli_env, world):
    result = CliRunner().invoke(
        cli.app, ["goods", "add", "--seller", "seller", "--title", "kite\x1b[2J", "--price", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "--title" in result.output
    assert "U+001B" in result.output


async def test_admin_forms_refuse_control_characters(world):
    import httpx

    from dueflow.api.app import create_app

    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        answer = await client.post("/admin/login", data={"token": token, "next": "/admin\x00"})
        assert answer.status_code == 422, answer.text
        assert "next" in answer.text
        assert "dueflow_admin" not in answer.cookies
