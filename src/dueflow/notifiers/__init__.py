"""Where reminders go: the log, or a signed webhook."""
