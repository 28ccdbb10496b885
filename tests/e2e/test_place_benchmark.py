"""The place-order benchmark stays honest: ``benchmarks/http_place.py`` runs end to end at a
tiny size (wrk against the reference server, then against ``dueflow serve``) with every
database check passing and the ratio printed; the reference refuses what dueflow refuses; and
``dueflow_db_statements_total`` counts what is sent. No timing is asserted."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from dueflow import bootstrap
from dueflow.config import Settings
from tests.conftest import SERVICE_URLS, in_ci, require_service

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _seed  # noqa: E402
import http_place  # noqa: E402
import reference_server  # noqa: E402
from http_tickets import free_port  # noqa: E402

pytestmark = pytest.mark.serial


def need_wrk() -> None:
    if shutil.which("wrk") is None:
        if in_ci():  # .ci/run installs it
            pytest.fail("wrk is not installed (apt-get install wrk)")
        pytest.skip("wrk is not installed (apt-get install wrk)")


def run_place(*args: str) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "http_place.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_tiny_place_run_checks_out_against_the_reference(database: str) -> None:
    need_wrk()
    args = ["--orders", "300", "--warmup", "20", "--seconds", "20", "--connections", "8"]
    if database == "postgres":
        require_service("postgres", "127.0.0.1", 5432)
        args += ["--backend", "postgres", "--postgres-url", str(SERVICE_URLS["postgres"])]
    result, stdout = run_place(*args)
    assert result["ok"]
    runs = result["runs"]
    assert isinstance(runs, list)
    assert [r["server"] for r in runs] == ["reference", "dueflow"]
    for run in runs:
        assert run["failed"] == [], run["failed"]
        assert all(value == 0 for name, value in run["db"].items() if name != "orders")
        # 300 goods and 20 seconds: the goods run out first, every one ordered once.
        assert run["placed"] == 300 and run["db"]["orders"] == 320
        assert run["statements_per_order"] and run["server_cpu_ms_per_order"]
    assert "dueflow / reference: orders/s " in stdout
    assert "statements a place: dueflow " in stdout


def seeded_sqlite(tmp_path: Path) -> tuple[str, list[str], list[int]]:
    tokens = ["token-one", "token-two"]
    url = f"sqlite:///{tmp_path / 'ref.db'}"
    return url, tokens, asyncio.run(http_place.seed(url, tokens, 3))


def test_the_reference_refuses_as_dueflow_does(tmp_path: Path) -> None:
    url, tokens, goods = seeded_sqlite(tmp_path)
    port = free_port()
    command = [sys.executable, str(http_place.REFERENCE), "--database-url", url]
    env = dict(os.environ)
    with _seed.started([*command, "--port", str(port)], env, port, tmp_path / "ref.log"):
        base = f"http://127.0.0.1:{port}"

        def place(body: object, token: str | None = tokens[0]) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return httpx.post(f"{base}/api/orders", json=body, headers=headers, timeout=10)

        assert place({"goods_id": goods[0]}, token=None).status_code == 401
        assert place({"goods_id": goods[0]}, token="nobody").status_code == 401
        assert place({"goods": goods[0]}).status_code == 422
        assert place({"goods_id": "1"}).status_code == 422
        assert place({"goods_id": 999}).status_code == 404
        first = place({"goods_id": goods[0]})
        assert first.status_code == 201
        assert first.json()["goods_id"] == goods[0]
        assert first.json()["status"] == "pending_payment"
        again = place({"goods_id": goods[0]}, token=tokens[1])
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "goods_unavailable"
        assert httpx.get(f"{base}/nowhere", timeout=10).status_code == 404
        counted = http_place.statements(port, "reference_db_statements_total")
        # 401 (no row), 404 (goods missing), 201 (all of PLACE), 409 (stops at the goods read).
        assert counted == 1 + 2 + len(reference_server.PLACE) + 2
    state = asyncio.run(http_place.check(url))
    assert state["orders"] == 1
    assert all(value == 0 for name, value in state.items() if name != "orders")


def test_the_reference_refuses_own_goods_and_goods_off_sale() -> None:
    base = {"buyer_id": 2, "seller_id": 1, "goods_status": "on_sale", "reserved_order_id": None}
    assert reference_server.goods_refusal(base) is None
    assert reference_server.goods_refusal({**base, "buyer_id": 1}) == (403, "not_allowed")
    assert reference_server.goods_refusal({**base, "goods_status": "sold"})[0] == 409  # type: ignore[index]
    assert reference_server.goods_refusal({**base, "reserved_order_id": 7})[0] == 409  # type: ignore[index]


def test_the_reference_refuses_sqlite_with_several_processes(tmp_path: Path) -> None:
    command = [sys.executable, str(http_place.REFERENCE), "--database-url", "sqlite:///x.db"]
    done = subprocess.run(
        [*command, "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "one writer" in done.stderr


async def test_statements_are_counted_per_dialect(settings: Settings) -> None:
    async with bootstrap.running(settings) as deps:

        def sent() -> float:
            value = deps.metrics.registry.get_sample_value(
                "dueflow_db_statements_total", {"dialect": "sqlite"}
            )
            return value or 0.0

        before = sent()
        async with deps.db.read() as conn:
            await conn.execute(text("SELECT 1"))
            await conn.execute(text("SELECT 2"))
        async with deps.db.report() as conn:
            await conn.execute(text("SELECT 3"))
        # Two SELECTs and a BEGIN on the inline engine, one and a BEGIN on the report engine.
        assert sent() - before == 5
        assert b'dueflow_db_statements_total{dialect="sqlite"}' in deps.metrics.render()
