"""Durable timers: the timers table is the truth; triggers only make firing timely."""
