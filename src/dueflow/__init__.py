"""dueflow: the order engine that moves every marketplace order through its life on time."""

from __future__ import annotations

__version__ = "0.1.0"
