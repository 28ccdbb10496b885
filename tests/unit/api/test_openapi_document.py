"""The OpenAPI document is docs/openapi.json, byte for byte: a change of the API's shape is a
change of that file, made on purpose and seen in review (a module move must not make one).

After a deliberate change: ``DUEFLOW_TEST_WRITE_OPENAPI=1 .venv/bin/pytest -q
tests/unit/api/test_openapi_document.py`` writes the file anew."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dueflow.api.app import create_app

DOCUMENT = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def rendered(spec: dict[str, object]) -> str:
    return json.dumps(spec, indent=1, ensure_ascii=False) + "\n"


async def test_the_openapi_document_is_the_published_one(world) -> None:
    text = rendered(create_app(world.deps).openapi())
    if os.environ.get("DUEFLOW_TEST_WRITE_OPENAPI") == "1":
        DOCUMENT.write_text(text, encoding="utf-8")
    assert text == DOCUMENT.read_text(encoding="utf-8"), (
        "the API's shape changed: if on purpose, write docs/openapi.json anew (see this module)"
    )
