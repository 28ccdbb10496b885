"""The ``rabbitmq`` trigger's wire: the delay levels, a timer's message body, and the
arithmetic of settling deliveries (which acks to send, ``multiple`` where it can)."""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from aio_pika.abc import AbstractIncomingMessage

from dueflow.store.timers import Armed

#: The delay levels, in milliseconds, smallest first.
LEVELS_MS: tuple[int, ...] = (
    100,
    250,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    7_200_000,
)
_LEVELS_US = tuple(ms * 1000 for ms in LEVELS_MS)
_US = timedelta(microseconds=1)


def choose_level(remaining: timedelta) -> int | None:
    """The largest delay level (in ms) not above ``remaining``, or None when ``remaining`` is
    below the smallest level (zero and negative included): the message goes to the due queue."""
    index = bisect_right(_LEVELS_US, remaining // _US) - 1
    return LEVELS_MS[index] if index >= 0 else None


def encode(timer: Armed) -> bytes:
    """A message body for ``timer``."""
    return json.dumps({"id": timer.id, "due_at": timer.due_at.isoformat()}).encode()


def decode(body: bytes) -> Armed:
    """The timer in a message body.

    Raises:
        ValueError: the body is not one of ours.
    """
    try:
        data = json.loads(body)
        timer_id, due_at = data["id"], datetime.fromisoformat(data["due_at"])
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a timer message: {body[:80]!r}") from exc
    if not isinstance(timer_id, int) or isinstance(timer_id, bool):
        raise ValueError(f"not a timer message: {body[:80]!r}")
    if due_at.tzinfo is None:
        due_at = due_at.replace(tzinfo=UTC)
    return Armed(id=timer_id, due_at=due_at)


@dataclass(order=True)
class _Held:
    """A delivered message not yet handed over: due within the smallest level."""

    due_at: datetime
    seq: int
    timer_id: int = field(compare=False)
    message: AbstractIncomingMessage = field(compare=False)


@dataclass
class _Tags:
    """The deliveries of one consuming channel (RabbitMQ numbers them 1, 2, 3, ... per channel):
    the tags not settled yet, and ``seen``, the tag up to which every delivery has reached the
    trigger (a delivery is a task of its own, so one may be seen before an earlier one)."""

    unsettled: set[int] = field(default_factory=set)
    seen: int = 0
    early: set[int] = field(default_factory=set)

    def delivered(self, tag: int) -> None:
        self.unsettled.add(tag)
        if tag != self.seen + 1:
            if tag > self.seen:
                self.early.add(tag)
            return
        self.seen = tag
        while self.seen + 1 in self.early:
            self.seen += 1
            self.early.discard(self.seen)

    def ack_frames(self, tags: set[int]) -> list[tuple[int, bool]]:
        """Settle ``tags`` (those still unsettled): the ``(tag, multiple)`` acks to send.

        One ``multiple`` ack covers the tags below every other unsettled tag and below every
        delivery not seen yet (a ``multiple`` ack settles all un-acked tags up to it, so it must
        never reach one that is held, being re-armed, handed over elsewhere or not seen); the
        rest are acked one by one. Never a tag twice: RabbitMQ closes the channel for that."""
        tags &= self.unsettled
        self.unsettled -= tags
        limit = min(self.seen + 1, min(self.unsettled, default=self.seen + 1))
        below = [t for t in tags if t < limit]
        frames = [(max(below), True)] if below else []
        frames += [(t, False) for t in sorted(tags) if t >= limit]
        return frames
