"""The ``log`` notifier: writes each reminder to the log."""

from __future__ import annotations

import logging

from dueflow.notifiers.base import Notifier, Reminder

log = logging.getLogger("dueflow.reminders")


class LogNotifier(Notifier):
    """Logs reminders (the default; a real deployment sets a webhook). A log line waits on
    no receiver: a whole batch goes in one wave."""

    sends_at_once = 10_000

    def __init__(self) -> None:
        self.sent: int = 0

    async def send(self, reminder: Reminder) -> None:
        self.sent += 1
        if reminder.reason is not None:
            log.info(
                "notice %s: order %s of buyer %s closed (%s)",
                reminder.kind,
                reminder.order_id,
                reminder.buyer_id,
                reminder.reason,
                extra={"order_id": reminder.order_id, "reminder_id": reminder.reminder_id},
            )
            return
        log.info(
            "reminder %s: order %s, buyer %s, pay %s before %s",
            reminder.kind,
            reminder.order_id,
            reminder.buyer_id,
            reminder.amount,
            reminder.pay_deadline.isoformat(),
            extra={"order_id": reminder.order_id, "reminder_id": reminder.reminder_id},
        )
