"""``dueflow serve`` writes one access line a request (uvicorn's own access log is off), as JSON
with DUEFLOW_LOG_FORMAT=json, and none with DUEFLOW_ACCESS_LOG=off."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e import live

pytestmark = pytest.mark.slow


def test_one_json_access_line_a_request_naming_its_caller(tmp_path):
    with live.serve(tmp_path, {"DUEFLOW_LOG_FORMAT": "json"}) as served:
        answer = httpx.get(
            f"{served.base}/api/orders",
            headers={"Authorization": f"Bearer {served.tokens['alice']}", "X-Request-Id": "e2e-1"},
        )
        assert answer.status_code == 200 and answer.headers["X-Request-Id"] == "e2e-1"
        assert served.stop() == 0
    mine = [line for line in served.output().splitlines() if "e2e-1" in line]
    assert len(mine) == 1, served.output()
    line = json.loads(mine[0])
    assert line["logger"] == "dueflow.access"
    assert (line["method"], line["route"], line["status"]) == ("GET", "/api/orders", 200)
    assert isinstance(line["user_id"], int) and "key_id" not in line
    assert "HTTP/1.1" not in served.output()  # no line from uvicorn's access log


def test_no_access_line_when_the_setting_turns_it_off(tmp_path):
    with live.serve(tmp_path, {"DUEFLOW_ACCESS_LOG": "off"}, dev_users=False) as served:
        answer = httpx.get(f"{served.base}/healthz", headers={"X-Request-Id": "e2e-2"})
        assert answer.headers["X-Request-Id"] == "e2e-2"
        assert served.stop() == 0
    assert "/healthz" not in served.output() and "e2e-2" not in served.output()
