"""Our Standard Webhooks signer against the scheme's own library (``standardwebhooks`` from PyPI,
a dev dependency): the same signatures, and what the notifier and the events webhook send
verifies there; a secret of the older scheme keeps working (as bytes) beside its old headers."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dueflow.config import load_settings
from dueflow.exceptions import ConfigError
from dueflow.notifiers import signing
from dueflow.notifiers.event_webhook import EventWebhook
from dueflow.notifiers.webhook import WebhookNotifier
from tests.unit.test_webhook import REMINDER, SECRET, Hook, check_signature, hook  # noqa: F401

BODY = b'{"id":"evt_1","type":"place"}'


# The ids are fixed: a secret made at collection would differ between pytest-xdist's processes.
@pytest.mark.parametrize(
    "secret",
    [signing.new_secret(), "whsec_" + "A" * 32, SECRET],
    ids=["new", "whsec-fixed", "plain"],
)
def test_our_signature_is_the_librarys(secret):
    key = secret if signing.is_standard(secret) else secret.encode()
    at = 1_767_225_600
    ours = signing.signature(signing.key_of(secret), "evt_1", at, BODY)
    assert ours == Webhook(key).sign("evt_1", datetime.fromtimestamp(at, UTC), BODY)
    headers = signing.headers([secret], "evt_1", int(time.time()), BODY)
    assert Webhook(key).verify(BODY, headers) == {"id": "evt_1", "type": "place"}
    with pytest.raises(WebhookVerificationError):
        Webhook(key).verify(BODY.replace(b"place", b"pay"), headers)


def test_a_new_secret_is_whsec_and_32_random_bytes():
    secret = signing.new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert secret != signing.new_secret()


def test_two_secrets_sign_side_by_side_and_either_verifies():
    old, new = signing.new_secret(), signing.new_secret()
    headers = signing.headers([new, old], "evt_9", int(time.time()), BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(BODY, headers)
    Webhook(new).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.new_secret()).verify(BODY, headers)


def test_a_malformed_whsec_secret_is_refused_at_start():
    with pytest.raises(ConfigError, match="DUEFLOW_EVENTS_WEBHOOK_SECRET"):
        load_settings(events_webhook_url="http://h.example/", events_webhook_secret="whsec_!!")
    with pytest.raises(ConfigError, match="DUEFLOW_NOTIFIER_SECRET"):
        load_settings(notifier_secret="whsec_" + base64.b64encode(b"short").decode())
    assert load_settings(notifier_secret="any old string").notifier_secret == "any old string"


async def test_a_notice_verifies_with_the_library(hook):  # noqa: F811
    secret = signing.new_secret()
    notifier = WebhookNotifier(url=hook.url, secret=secret)
    try:
        await notifier.send(REMINDER)
    finally:
        await notifier.close()
    (request,) = hook.received
    notice = Webhook(secret).verify(request.body, request.headers)
    assert (notice["id"], notice["type"]) == ("ntc_41", "pay_reminder")
    assert request.headers["webhook-id"] == notice["id"]  # the envelope's id
    assert "x-dueflow-signature" not in request.headers  # a whsec_ secret: standard headers only


async def test_a_notice_under_an_older_secret_verifies_both_ways(hook):  # noqa: F811
    notifier = WebhookNotifier(url=hook.url, secret=SECRET)
    try:
        await notifier.send(REMINDER)
    finally:
        await notifier.close()
    (request,) = hook.received
    Webhook(SECRET.encode()).verify(request.body, request.headers)
    check_signature(request)  # today's receivers go on verifying
    assert request.headers["webhook-id"] == json.loads(request.body)["id"] == "ntc_41"
    assert request.headers["x-dueflow-delivery"] == "41"  # the bare reminder id, as it was


async def test_an_event_verifies_with_the_library(hook):  # noqa: F811
    secret = signing.new_secret()
    sender = EventWebhook(url=hook.url, secret=secret)
    try:
        await sender.deliver({"id": "evt_3", "type": "pay"}, replay=True)
    finally:
        await sender.close()
    (request,) = hook.received
    assert Webhook(secret).verify(request.body, request.headers) == {"id": "evt_3", "type": "pay"}
    assert (request.headers["webhook-id"], request.headers["dueflow-replay"]) == ("evt_3", "true")
