"""ticket check-in: when, at which gate and by whom a ticket was let in, and a show's tickets
in seat order (the door's list and its CSV)"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import UTCDateTime

revision = "0020"
down_revision = "0019"


def upgrade() -> None:
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checked_in_at", UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column("checked_in_gate", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("checked_in_by", sa.String(length=64), nullable=True))
    op.create_index("ix_tickets_show_id_seat_id", "tickets", ["show_id", "seat_id"])


#: The foreign key of tickets.show_id, whose index MySQL dropped for ours (it serves the key).
SHOW_KEY = "fk_tickets_show_id_shows"


def downgrade() -> None:
    if op.get_bind().dialect.name == "mysql":
        # MySQL will not drop an index a foreign key needs: the key goes first and comes back
        # with an index of its own, as before 0020.
        op.drop_constraint(SHOW_KEY, "tickets", type_="foreignkey")
        op.drop_index("ix_tickets_show_id_seat_id", table_name="tickets")
        op.create_foreign_key(SHOW_KEY, "tickets", "shows", ["show_id"], ["id"])
    else:
        op.drop_index("ix_tickets_show_id_seat_id", table_name="tickets")
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.drop_column("checked_in_by")
        batch_op.drop_column("checked_in_gate")
        batch_op.drop_column("checked_in_at")
