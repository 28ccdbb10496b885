"""timers done_at index"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_index("ix_timers_done_at", "timers", ["done_at"])


def downgrade() -> None:
    op.drop_index("ix_timers_done_at", table_name="timers")
