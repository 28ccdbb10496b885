"""Every error the API answers is documented: in the OpenAPI document each 4xx and 5xx answer
of each route is the error schema with the enum of codes it can carry (codes of the registry,
of that status; both Idempotency-Key 409s on every route taking the header), and the answers the app makes itself (no route, wrong method, no token, a body
too large, invalid input, a crash) carry registry codes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request

from dueflow.api import errors
from dueflow.api.app import create_app
from dueflow.api.common import EVERY_ROUTE, FOR_A_USER, KEYED, WITH_BODY, WITH_PARAMS
from dueflow.error_codes import ErrorCode, code_of
from tests.unit.api import Api, shop_world

ERROR_REF = "#/components/schemas/ErrorBody"


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with shop_world.shop_api(world.deps) as api:
        yield api


def declared(operation: dict[str, Any]) -> dict[int, set[ErrorCode]]:
    """The codes an operation declares, by status; each answer the error schema narrowed."""
    found: dict[int, set[ErrorCode]] = {}
    for status, answer in operation["responses"].items():
        if status.startswith(("4", "5")):
            schema = answer["content"]["application/json"]["schema"]
            assert schema["$ref"] == ERROR_REF, (status, schema)
            enum = schema["properties"]["error"]["properties"]["code"]["enum"]
            assert enum, status
            found[int(status)] = {code_of(text) for text in enum}
    return found


async def test_every_error_answer_of_every_route_names_its_codes(api):
    app = create_app(api.deps)
    spec = app.openapi()
    schema_enum = spec["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["enum"]
    assert {code_of(text) for text in schema_enum} == {c for c in ErrorCode if c.status}
    checked = keyed = 0
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            codes = declared(operation)
            for status, found in codes.items():
                assert all(code.status == status for code in found), (method, path, status)
            if not path.startswith("/api/"):
                assert not codes, (method, path)
                continue
            every = {code for found in codes.values() for code in found}
            assert set(EVERY_ROUTE) <= every, (method, path)
            # A key acting for nobody is refused on a route for a user, never on an admin's.
            for_a_user = not path.startswith("/api/admin/")
            assert (set(FOR_A_USER) <= every) is for_a_user, (method, path)
            if "requestBody" in operation:
                assert set(WITH_BODY) <= every, (method, path)
            if operation.get("parameters"):
                assert set(WITH_PARAMS) <= every, (method, path)
            # A route that takes an Idempotency-Key declares both of its 409s.
            headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
            if "Idempotency-Key" in headers:
                assert set(KEYED) <= codes.get(409, set()), (method, path)
                keyed += 1
            checked += 1
    assert checked > 30
    assert keyed > 20


async def test_the_apps_own_answers_carry_registry_codes(api):
    cases = [
        ("GET", "/api/no-such-thing", "buyer", {}, 404, ErrorCode.NOT_FOUND),
        ("DELETE", "/api/goods", "buyer", {}, 405, ErrorCode.METHOD_NOT_ALLOWED),
        ("GET", "/api/orders", None, {}, 401, ErrorCode.UNAUTHORIZED),
        ("GET", "/api/orders", "buyer", {"params": {"limit": "x"}}, 422, ErrorCode.INVALID_INPUT),
        ("POST", "/api/goods", "seller", {"content": b"x" * 70_000}, 413, ErrorCode.BODY_TOO_LARGE),
        ("GET", "/api/admin/summary", "buyer", {}, 403, ErrorCode.NOT_ALLOWED),
        # the guard's: a key without the scope, a key acting for nobody, a token acting for one
        ("GET", "/api/orders", None, {"headers": await api.as_key("catalog", "buyer")}, 403,
         ErrorCode.MISSING_SCOPE),
        ("GET", "/api/orders", None, {"headers": await api.as_key("orders", None)}, 400,
         ErrorCode.ACT_AS_REQUIRED),
        ("GET", "/api/orders", "buyer", {"headers": {"Dueflow-Act-As": "host-seller"}}, 403,
         ErrorCode.ACT_AS_NOT_ALLOWED),
    ]  # fmt: skip
    for method, path, who, call, status, code in cases:
        answer = await api.call(method, path, who, **call)
        assert answer.status_code == status == code.status, (path, answer.text)
        assert answer.json()["error"]["code"] == code, (path, answer.text)
    request = Request({"type": "http", "method": "GET", "path": "/api/x", "headers": []})
    crash = await errors.unexpected_error(request, RuntimeError("bug"))
    assert crash.status_code == 500
    assert b'"code":"internal_error"' in crash.body
