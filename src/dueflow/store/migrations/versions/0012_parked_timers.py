"""parked timers: a timer's consecutive failures, and an index of the parked ones"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"

#: As store/schema.py declares it: partial on PostgreSQL, whose ix_timers_live holds only live
#: timers; a plain index elsewhere, as ix_timers_live is.
PARKED_TIMERS = "state = 'parked'"


def upgrade() -> None:
    # Every timer so far is taken as having failed no time in a row: the attempts counted so
    # far were claims, a handler's own retries among them.
    with op.batch_alter_table("timers", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("failures", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.create_index(
            "ix_timers_parked",
            ["state", "due_at"],
            unique=False,
            postgresql_where=sa.text(PARKED_TIMERS),
        )


def downgrade() -> None:
    with op.batch_alter_table("timers", schema=None) as batch_op:
        batch_op.drop_index("ix_timers_parked")
        batch_op.drop_column("failures")
