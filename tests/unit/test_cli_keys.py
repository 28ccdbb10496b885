"""``dueflow keys`` through typer's CliRunner on a migrated SQLite file: add prints the secret
once, list never shows it, rotate prints a new one, revoke; refusals exit 2 changing nothing."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from dueflow import bootstrap, cli
from dueflow.cli import _common
from dueflow.config import Settings
from dueflow.service import keys
from tests.conftest import table_snapshot


@pytest.fixture
def run(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DUEFLOW_PROFILE", "prod")
    runner = CliRunner(env={"COLUMNS": "200"})  # a table's line each, unwrapped
    # The command line's console took its width when first imported (80 without a terminal,
    # perhaps by another test): a table's line each, unwrapped, whatever ran before.
    monkeypatch.setattr(_common.out, "width", 200)
    return lambda *args: runner.invoke(cli.app, list(args))


def secret_in(result: Result) -> str:
    assert result.exit_code == 0, result.output
    [secret] = re.findall(r"secret \(shown once\): (dfk_live_\S+)", result.stdout)
    return str(secret)


def authenticate(settings: Settings, secret: str) -> Any:
    async def go() -> Any:
        async with bootstrap.running(settings, migrate_sqlite=False) as deps:
            return await keys.authenticate(deps, secret, "orders", None)

    return asyncio.run(go())


def snapshot(settings: Settings) -> Any:
    async def go() -> Any:
        async with bootstrap.running(settings, migrate_sqlite=False) as deps:
            return await table_snapshot(deps)

    return asyncio.run(go())


def test_keys_are_added_listed_rotated_and_revoked(run, settings):
    added = run("keys", "add", "shop back end", "--scope", "orders", "--scope", "catalog")
    secret = secret_in(added)
    assert "added key 1 'shop back end' scopes: orders catalog" in added.stdout
    assert authenticate(settings, secret).key_id == 1
    listed = run("keys", "list")
    assert listed.exit_code == 0, listed.output
    assert secret[:15] in listed.stdout and secret not in listed.stdout
    new = secret_in(run("keys", "rotate", "1"))
    assert new != secret and authenticate(settings, new).key_id == 2
    assert authenticate(settings, secret).key_id == 1  # until revoked
    assert run("keys", "revoke", "1").stdout.strip() == "key 1 revoked"
    with pytest.raises(Exception, match="revoked"):
        authenticate(settings, secret)
    listed = run("keys", "list").stdout
    assert "revoked" in listed and "cli" in listed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "shop", "--scope", "shipping"], "unknown shipping"),
        (
            ["add", "shop", "--scope", "orders", "--expires-at", "2020-01-01T00:00:00+00:00"],
            "future",
        ),
        (["rotate", "99"], "no service key 99"),
        (["revoke", "99"], "no service key 99"),
    ],
)
def test_a_refused_key_command_exits_2_and_changes_nothing(run, settings, args, message):
    run("keys", "add", "first", "--scope", "events")
    before = snapshot(settings)
    result = run("keys", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert snapshot(settings) == before
