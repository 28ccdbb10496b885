from __future__ import annotations

import json
import logging

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
