"""docs/errors.md lists every error code of the registry (dueflow.error_codes) with its status,
when it happens and what a client should do: its tables are written from the registry, and this
test fails while they differ.

After a change to the registry: ``DUEFLOW_TEST_WRITE_ERRORS=1 .venv/bin/pytest -q
tests/unit/test_docs_errors.py`` writes the tables anew (the prose around them stays)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dueflow.error_codes import Action, ErrorCode

PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def actions() -> list[str]:
    rows = ["| action | what a client should do |", "|---|---|"]
    rows += [f"| `{action}` | {action.advice} |" for action in Action]
    return rows


def codes() -> list[str]:
    rows = ["| code | status | when | what to do |", "|---|---|---|---|"]
    for code in ErrorCode:
        status = str(code.status) if code.status else "none (never in an HTTP answer)"
        rows.append(f"| `{code}` | {status} | {code.when} | `{code.action}` |")
    return rows


def written(page: str) -> str:
    """``page`` with each generated section holding what the registry says."""
    for name, rows in (("actions", actions()), ("codes", codes())):
        section = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end -->)", re.DOTALL)
        assert section.search(page), f"docs/errors.md has no generated section {name}"
        table = "\n".join(rows) + "\n"
        page = section.sub(lambda found, table=table: found[1] + table + found[2], page)
    return page


def test_docs_errors_lists_every_code_of_the_registry():
    page = PAGE.read_text(encoding="utf-8")
    expected = written(page)
    if os.environ.get("DUEFLOW_TEST_WRITE_ERRORS") == "1":
        PAGE.write_text(expected, encoding="utf-8")
        page = expected
    assert page == expected, "docs/errors.md is behind the registry: write it anew (see above)"
    listed = set(re.findall(r"^\| `([a-z_]+)` \| ", page, re.MULTILINE))
    assert listed >= {str(code) for code in ErrorCode}
