from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from dueflow import logs
from dueflow.logs import JsonFormatter


def test_json_lines_carry_the_ids_a_record_was_logged_with():
    record = logging.LogRecord("dueflow.x", logging.ERROR, __file__, 1, "paid %s", ("12.50",), None)
    record.order_id = 7
    record.pay_no = "20260301abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "paid 12.50"
    assert (line["level"], line["logger"]) == ("error", "dueflow.x")
    assert (line["order_id"], line["pay_no"]) == (7, "20260301abc")
    assert "timer_id" not in line
    assert line["at"].endswith("+00:00")


def test_a_throttled_kind_is_a_line_a_period_saying_how_many_it_stands_for(monkeypatch, caplog):
    monkeypatch.setattr(logs, "_throttled", {})
    monkeypatch.setattr(logs, "THROTTLE_SECONDS", 3600.0)
    log = logging.getLogger("dueflow.test_logs")
    with caplog.at_level(logging.WARNING):
        written = [logs.throttled(log, logging.WARNING, "down", "db down: %s", n) for n in range(5)]
        other = logs.throttled(log, logging.WARNING, "other", "redis down")
        monkeypatch.setattr(logs, "THROTTLE_SECONDS", 0.0)  # the period is over
        logs.throttled(log, logging.WARNING, "down", "db down: %s", 5)
    assert written == [True, False, False, False, False] and other
    assert [r.getMessage() for r in caplog.records] == [
        "db down: 0",
        "redis down",
        "db down: 5 (4 more like it held back)",
    ]


@pytest.fixture
def configured() -> Iterator[None]:
    """:func:`logs.configure` may change the root logger and the access log's level: put them
    back after the test (pytest's own capture lives on the root logger)."""
    root, access = logging.getLogger(), logging.getLogger(logs.ACCESS)
    handlers, level, access_level = root.handlers[:], root.level, access.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    access.setLevel(access_level)


def test_json_lines_carry_the_access_fields_and_the_bound_ids(configured, capsys):
    logs.configure(verbose=False, json_lines=True, access_log=True)
    with logs.bound(request_id="r-1"), logs.bound(trace_id=None, order_id=9):
        logging.getLogger(logs.ACCESS).info(
            "GET /x 200 1.0 ms",
            extra={"method": "GET", "route": "/x", "status": 200, "duration_ms": 1.03},
        )
        logging.getLogger("dueflow.x").warning("held", extra={"order_id": 10})
    logging.getLogger("dueflow.x").warning("after")
    access, held, after = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert access["logger"] == logs.ACCESS and access["level"] == "info"
    assert {k: access[k] for k in ("method", "route", "status", "duration_ms", "request_id")} == {
        "method": "GET",
        "route": "/x",
        "status": 200,
        "duration_ms": 1.03,
        "request_id": "r-1",
    }
    assert "user_id" not in access and "trace_id" not in access  # None: left out
    assert (held["request_id"], held["order_id"]) == ("r-1", 10)  # its own id wins
    assert "request_id" not in after  # the binding ended with its block


def test_text_lines_name_the_bound_ids_after_the_message(configured, capsys):
    logs.configure(verbose=True, json_lines=False)
    with logs.bound(request_id="r-2", timer_id=4):
        logging.getLogger("dueflow.x").info("cancelled")
    logging.getLogger(logs.ACCESS).info("GET /x 200 1.0 ms")  # no access log unless asked
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(" INFO dueflow.x cancelled request_id=r-2 timer_id=4")


def test_the_access_log_is_on_at_info_when_asked_even_when_not_verbose(configured):
    logs.configure(verbose=False, json_lines=False, access_log=True)
    assert logging.getLogger(logs.ACCESS).isEnabledFor(logging.INFO)
    assert not logging.getLogger("dueflow.x").isEnabledFor(logging.INFO)
    logs.configure(verbose=True, json_lines=False, access_log=False)
    assert not logging.getLogger(logs.ACCESS).isEnabledFor(logging.INFO)


def test_a_line_logged_under_a_span_carries_its_trace_id(configured, capsys):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dueflow import tracing

    logs.configure(verbose=False, json_lines=True)
    log = logging.getLogger("dueflow.x")
    tracing.start([InMemorySpanExporter()])
    try:
        with tracing.span("timer cancel_unpaid", root=True) as span:
            log.warning("cancelled")
        log.warning("outside")
    finally:
        tracing.stop()
    log.warning("off")
    inside, outside, off = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert span is not None
    assert inside["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "trace_id" not in outside and "trace_id" not in off
