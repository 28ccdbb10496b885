"""The soak's webhook receiver counts what arrived whole: a request cut off mid-body (its
sender SIGKILLed mid-send) is recorded but is no delivery (a chaos soak saw one as "evt_0")."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx

from tests.conftest import eventually_sync
from tests.soak.receiver import receiving


def test_a_whole_request_is_a_delivery_and_a_cut_off_one_is_not() -> None:
    with receiving() as (receiver, base):
        body = {"id": "evt_7", "type": "pay", "version": 1, "order": {"id": 3}}
        answer = httpx.post(f"{base}/events", json=body, headers={"X-Dueflow-Delivery": "evt_7"})
        assert answer.status_code == 200

        where = urlsplit(base)
        head = (
            f"POST {where.path}/events HTTP/1.1\r\nHost: {where.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        )
        with socket.create_connection((where.hostname, where.port)) as raw:
            raw.sendall(head.encode() + json.dumps(body).encode()[:10])
            raw.shutdown(socket.SHUT_WR)  # the sender dies: the rest never comes
        assert eventually_sync(lambda: receiver.count("/events") == 2)

        whole, cut = receiver.snapshot()
        assert (whole["status"], whole["body"]) == (200, body)
        assert cut["status"] == 400 and isinstance(cut["body"], str)
