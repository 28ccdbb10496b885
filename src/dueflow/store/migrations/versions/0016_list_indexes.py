"""list indexes of the catalogue and the refunds"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"

#: The shows, flash sales, coupon templates and refunds lists read pages newest first by id
#: within one filter: each index puts the filter's equality first and id last, so a page is one
#: range read (see store/lists.py). SKUs, coupons and users had theirs already.
INDEXES = {
    "ix_shows_status_id": ("shows", ["status", "id"]),
    "ix_flash_sales_sku_id_id": ("flash_sales", ["sku_id", "id"]),
    "ix_flash_sales_seller_id_id": ("flash_sales", ["seller_id", "id"]),
    "ix_coupon_templates_seller_id_id": ("coupon_templates", ["seller_id", "id"]),
    "ix_refunds_state_id": ("refunds", ["state", "id"]),
}
#: The one-column indexes the new ones make redundant (each is their first column), dropped
#: once the new ones exist: on MariaDB the first two serve a foreign key until then.
REPLACED = {
    "ix_flash_sales_sku_id": ("flash_sales", ["sku_id"]),
    "ix_coupon_templates_seller_id": ("coupon_templates", ["seller_id"]),
    "ix_refunds_state": ("refunds", ["state"]),
}
#: MySQL/MariaDB drop the index they made for this foreign key once another index can serve it
#: (ix_flash_sales_seller_id_id), and refuse to drop the last one that does.
SELLER_KEY = "fk_flash_sales_seller_id_users"


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)
    for name, (table, _) in REPLACED.items():
        op.drop_index(name, table_name=table)


def downgrade() -> None:
    for name, (table, columns) in REPLACED.items():
        op.create_index(name, table, columns)
    mysql = op.get_bind().dialect.name == "mysql"
    if mysql:
        op.drop_constraint(SELLER_KEY, "flash_sales", type_="foreignkey")
    for name, (table, _) in reversed(INDEXES.items()):
        op.drop_index(name, table_name=table)
    if mysql:  # made again, the key makes its own index again, as it was at 0012
        op.create_foreign_key(SELLER_KEY, "flash_sales", "users", ["seller_id"], ["id"])
