"""timers done_at index

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 05:50:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_timers_done_at", "timers", ["done_at"])


def downgrade() -> None:
    op.drop_index("ix_timers_done_at", table_name="timers")
