"""trace parents: the W3C traceparent kept with each timer and order event"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"

#: Where a traceparent is kept: the span that armed a timer or wrote an event (NULL while
#: tracing is off), so the worker's handler and the webhook delivery link back to it.
TABLES = ("timers", "order_events")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("trace_parent", sa.String(55), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite has it since 3.35): batch mode would copy the timers table
    # on SQLite, its partial indexes with it.
    for table in TABLES:
        op.drop_column(table, "trace_parent")
