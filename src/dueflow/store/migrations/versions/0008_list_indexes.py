"""list indexes"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"

#: The goods and orders lists read pages newest first by id within one filter: each index puts
#: the filter's equalities first and id last, so a page is one range read (see store/lists.py).
INDEXES = {
    "ix_goods_status_id": ("goods", ["status", "id"]),
    "ix_goods_seller_id_status_id": ("goods", ["seller_id", "status", "id"]),
    "ix_goods_seller_id_id": ("goods", ["seller_id", "id"]),
    "ix_orders_buyer_id_id": ("orders", ["buyer_id", "id"]),
    "ix_orders_buyer_id_status_id": ("orders", ["buyer_id", "status", "id"]),
    "ix_orders_seller_id_id": ("orders", ["seller_id", "id"]),
    "ix_orders_seller_id_status_id": ("orders", ["seller_id", "status", "id"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


#: MySQL/MariaDB drop the index they made for this foreign key once another index can serve it
#: (ix_goods_seller_id_*), and refuse to drop the last one that does.
SELLER_KEY = "fk_goods_seller_id_users"


def downgrade() -> None:
    mysql = op.get_bind().dialect.name == "mysql"
    if mysql:
        op.drop_constraint(SELLER_KEY, "goods", type_="foreignkey")
    for name, (table, _) in reversed(INDEXES.items()):
        op.drop_index(name, table_name=table)
    if mysql:  # made again, the key makes its own index again, as it was at 0007
        op.create_foreign_key(SELLER_KEY, "goods", "users", ["seller_id"], ["id"])
