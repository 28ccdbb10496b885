"""Reading envelopes in tests (docs/events.md): an event's seq from its id, and the published
schema (the OpenAPI document's ``Envelope``) every envelope must validate against."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema_rs

DOC = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def seq_of(envelope: dict[str, Any]) -> int:
    """The seq of an event's envelope (its id is ``evt_<seq>``)."""
    kind, _, seq = envelope["id"].partition("_")
    assert kind == "evt", envelope["id"]
    return int(seq)


def user(user_id: int, key_id: int | None = None) -> dict[str, Any]:
    """The envelope's actor for a user."""
    return {"type": "user", "user_id": user_id, "key_id": key_id}


@functools.cache
def validator(document: str | None = None) -> Any:
    """A validator of the ``Envelope`` component of the OpenAPI document (the committed one,
    or ``document``'s text), its references resolved inside the document."""
    doc = json.loads(document) if document is not None else json.loads(DOC.read_text())
    schema = {**doc, "$ref": "#/components/schemas/Envelope"}
    return jsonschema_rs.Draft202012Validator(schema)


def invalid(envelope: dict[str, Any], document: str | None = None) -> list[str]:
    """What is wrong with ``envelope`` against the published schema (nothing: valid)."""
    return [str(error) for error in validator(document).iter_errors(envelope)]
