from __future__ import annotations

import json
import logging

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
