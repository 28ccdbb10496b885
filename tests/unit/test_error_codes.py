"""The registry of error codes (dueflow.error_codes) covers every error: each DueflowError
subclass anywhere in dueflow names a code of it, each code is raised by a class or answered by
the API itself, and each says its status, when it happens and what a client should do."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import dueflow
from dueflow import error_codes
from dueflow.api import errors as api_errors
from dueflow.api.schemas import ERROR_MEANING
from dueflow.error_codes import Action, ErrorCode
from dueflow.exceptions import DueflowError

#: The codes the API answers with by itself, not from an exception class.
ANSWERED_BY_THE_API = {
    *error_codes.FOR_HTTP_STATUS.values(),
    ErrorCode.MALFORMED_JSON,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.HTTP_ERROR,
}


def every_error_class() -> list[type[DueflowError]]:
    """Every subclass of DueflowError in dueflow (every module imported first)."""
    for module in pkgutil.walk_packages(dueflow.__path__, "dueflow."):
        importlib.import_module(module.name)

    def below(cls: type[DueflowError]) -> Iterator[type[DueflowError]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return [DueflowError, *below(DueflowError)]


def test_every_error_class_names_a_code_of_the_registry():
    classes = every_error_class()
    assert len(classes) > 30
    for cls in classes:
        assert isinstance(cls.code, ErrorCode), cls
        assert error_codes.code_of(str(cls.code)) is cls.code, cls
        # The API answers it with its code's status (500 for a code no answer carries); an
        # instance unmade (MissingScope takes the scope it misses).
        assert api_errors.status_of(cls.__new__(cls)) == (cls.code.status or 500), cls


def test_every_code_is_raised_or_answered():
    raised = {cls.code for cls in every_error_class()}
    assert set(ErrorCode) == raised | ANSWERED_BY_THE_API
    assert set(error_codes.FOR_HTTP_STATUS) == {400, 401, 403, 404, 405, 413}
    for status, code in error_codes.FOR_HTTP_STATUS.items():
        assert code.status == status


def test_every_code_says_its_status_when_and_what_to_do():
    assert len({str(code) for code in ErrorCode}) == len(ErrorCode)
    for code in ErrorCode:
        assert code.name == code.value.upper(), code
        assert code.status is None or code.status in ERROR_MEANING, code
        assert isinstance(code.action, Action), code
        assert code.when.endswith("."), code
        assert code.action.advice.endswith("."), code


def test_the_codes_clients_switch_on_keep_their_text():
    """Clients compare these strings: none of them may change."""
    assert {str(code) for code in ErrorCode} >= {
        "error", "bad_config", "not_migrated", "refused", "invalid_input", "unstorable_value",
        "conflict", "not_found", "not_allowed", "not_your_role", "invalid_transition",
        "goods_unavailable", "seat_unavailable", "seat_limit_exceeded", "sales_closed",
        "out_of_stock", "purchase_limit_exceeded", "coupon_unusable", "idempotency_key_reused",
        "payment_mismatch", "timer_not_waiting", "backend_error", "backend_unavailable", "busy",
        "delivery_unknown", "provider_error", "provider_unavailable", "notification_rejected",
        "bad_signature", "stale_timestamp", "malformed_notification", "amount_mismatch",
        "wrong_merchant", "bad_request", "unauthorized", "forbidden", "method_not_allowed",
        "body_too_large", "http_error", "malformed_json", "internal_error", "bad_server",
        "server_lost", "missing_scope", "act_as_required", "act_as_not_allowed",
        "unsafe_webhook_url", "idempotency_key_in_use",
    }  # fmt: skip


def test_a_field_path_is_written_as_clients_index():
    assert api_errors.field_path(("body", "lines", 0, "quantity")) == "body.lines[0].quantity"
    assert api_errors.field_path(("query", "limit")) == "query.limit"
    assert api_errors.field_path(()) == ""
