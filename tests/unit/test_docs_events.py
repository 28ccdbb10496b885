"""docs/events.md names every event the code writes to an order's timeline (and so to the
events feed and webhook): a host codes against that table.

The events written are found in the source, not listed by hand: every move of
:class:`~dueflow.domain.lifecycle.OrderEvent`, and every literal name handed to the writers
(``event="..."``, ``Entry(order_id, "...")``); a name built with an f-string (``refund_{to}``)
must match at least one documented name of its shape.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from dueflow.domain.lifecycle import OrderEvent

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
