"""docs/events.md names every event the code writes to an order's timeline (and so to the
events feed and webhook): a host codes against that table.

The events written are found in the source, not listed by hand: every move of
:class:`~dueflow.domain.lifecycle.OrderEvent`, and every literal name handed to the writers
(``event="..."``, ``Entry(order_id, "...")``); a name built with an f-string (``refund_{to}``)
must match at least one documented name of its shape.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dueflow.domain.events import EventType
from dueflow.domain.lifecycle import OrderEvent
from tests.envelopes import invalid

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dueflow"
#: The writers of order events; the simulator's and the reminders' ``event`` are other things.
SKIP = ("payments/simulator", "notifiers", "service/notifications.py", "store/notifications.py")


def documented() -> set[str]:
    """The names in the first column of the events table of docs/events.md."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "events.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


def written() -> tuple[set[str], set[str]]:
    """The literal event names the code writes, and the patterns of the built ones."""
    names = {event.value for event in OrderEvent}
    patterns: set[str] = set()
    for path in SRC.rglob("*.py"):
        if any(part in path.as_posix() for part in SKIP):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            values = [k.value for k in node.keywords if k.arg == "event"]
            callee = node.func
            if (isinstance(callee, ast.Attribute) and callee.attr == "Entry") and len(
                node.args
            ) > 1:
                values.append(node.args[1])
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.add(value.value)
                elif isinstance(value, ast.JoinedStr):
                    patterns.add(
                        "".join(
                            re.escape(part.value) if isinstance(part, ast.Constant) else "[a-z_]+"
                            for part in value.values
                        )
                    )
    return names, patterns


def test_the_scan_finds_the_writers():
    names, patterns = written()
    assert {"place", "released", "discrepancy", "show_cancelled"} <= names
    assert "refund_[a-z_]+" in patterns


def test_every_event_the_code_writes_is_in_docs_events_md():
    names, patterns = written()
    docs = documented()
    assert sorted(names - docs) == []
    for pattern in patterns:
        assert any(re.fullmatch(pattern, name) for name in docs), pattern


def test_every_event_the_code_writes_is_an_event_type():
    names, patterns = written()
    types = {t.value for t in EventType}
    assert sorted(names - types) == []
    for pattern in patterns:
        assert any(re.fullmatch(pattern, name) for name in types), pattern


START, END = "<!-- examples: written by tests/unit/test_envelopes.py -->", "<!-- /examples -->"


def examples() -> dict[str, dict[str, Any]]:
    """The example envelopes of docs/events.md, by type."""
    text = (ROOT / "docs" / "events.md").read_text()
    section = text.split(START, 1)[1].split(END, 1)[0]
    found = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)]
    return {e["type"]: e for e in found}


def write_examples(envelopes: Iterable[dict[str, Any]]) -> None:
    """Rewrite the examples of docs/events.md: the first envelope of each type, in the
    order of :class:`EventType` (``DUEFLOW_TEST_WRITE_EVENT_EXAMPLES=1`` on test_envelopes)."""
    first: dict[str, dict[str, Any]] = {}
    for envelope in envelopes:
        first.setdefault(envelope["type"], envelope)
    blocks = [
        f"### `{t.value}`\n\n```json\n{json.dumps(first[t.value], indent=1)}\n```\n"
        for t in EventType
        if t.value in first
    ]
    path = ROOT / "docs" / "events.md"
    head, rest = path.read_text().split(START, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{START}\n\n{chr(10).join(blocks)}\n{END}{tail}")


def test_docs_events_md_has_an_example_of_every_type_each_valid():
    found = examples()
    assert sorted(set(EventType) - set(found)) == []
    assert {t: invalid(e) for t, e in found.items() if invalid(e)} == {}
