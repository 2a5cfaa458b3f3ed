"""What the benchmark's deliveries are about: one provider, one event type, one business table."""

from __future__ import annotations

PROVIDER = "bench"
EVENT_TYPE = "order.created"
BUSINESS_TABLE = "bench_orders"
# No unique key on purpose: a second commit of the same delivery must show up as a second row,
# not be hidden by a constraint.
BUSINESS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {BUSINESS_TABLE} ("
    " webhook_id TEXT NOT NULL, fence INTEGER NOT NULL, amount_cents INTEGER NOT NULL)"
)
INSERT = (
    f"INSERT INTO {BUSINESS_TABLE} (webhook_id, fence, amount_cents) "  # noqa: S608
    "VALUES ($1, $2, $3)"
)
