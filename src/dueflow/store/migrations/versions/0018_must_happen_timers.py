"""must-happen timers: a partial index a worker that is behind claims them by"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"

#: As store/_schema_timers.py declares it (domain/timers.MUST_HAPPEN, sorted), written out here
#: so the migration stays what it was when the kinds change.
MUST_HAPPEN_WAITING = (
    "state = 'scheduled' AND kind IN ('auto_review', 'cancel_unpaid', 'cancel_unshipped', "
    "'confirm_receipt', 'refund_check', 'show_cancel')"
)
#: MySQL has no partial index: there the claim walks ix_timers_live.
PARTIAL = ("postgresql", "sqlite")


def upgrade() -> None:
    if op.get_bind().dialect.name not in PARTIAL:
        return
    op.create_index(
        "ix_timers_must",
        "timers",
        ["state", "due_at", "id"],
        unique=False,
        postgresql_where=sa.text(MUST_HAPPEN_WAITING),
        sqlite_where=sa.text(MUST_HAPPEN_WAITING),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name not in PARTIAL:
        return
    op.drop_index("ix_timers_must", table_name="timers")
