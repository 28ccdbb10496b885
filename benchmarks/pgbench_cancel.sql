-- The statements one dueflow cancel_unpaid batch runs on PostgreSQL, as plain SQL:
-- the physical limit that pg_limit.py measures with pgbench. Each transaction takes the next
-- block of :block orders (timer ids equal order ids in the seeded data).
SELECT nextval('bench_block') * :block + 1 AS lo \gset
BEGIN;
UPDATE timers SET state = 'claimed', attempts = attempts + 1, lease_until = now() + interval '5 minutes', claim_token = 'bench'
 WHERE id IN (SELECT id FROM timers WHERE state = 'scheduled' AND due_at <= now() AND id BETWEEN :lo AND :lo + :block - 1
              ORDER BY due_at, id LIMIT :block FOR UPDATE SKIP LOCKED)
 RETURNING id, order_id, kind, deadline_at, due_at, attempts;
COMMIT;
BEGIN;
SELECT id FROM payments WHERE order_id BETWEEN :lo AND :lo + :block - 1 AND state = 'open';
COMMIT;
BEGIN;
UPDATE orders SET status = 'cancelled_unpaid', cancelled_at = now(), cancel_reason = 'pay_timeout', updated_at = now()
 WHERE id BETWEEN :lo AND :lo + :block - 1 AND status = 'pending_payment' AND pay_deadline <= now()
 RETURNING id, order_type, goods_id, buyer_id, seller_id;
UPDATE goods SET reserved_order_id = NULL, updated_at = now()
 WHERE reserved_order_id BETWEEN :lo AND :lo + :block - 1 AND status = 'on_sale';
UPDATE payments SET state = 'closed', handled_at = now() WHERE order_id BETWEEN :lo AND :lo + :block - 1 AND state = 'open';
UPDATE timers SET state = 'cancelled', outcome = 'order moved on', done_at = now(), lease_until = NULL
 WHERE order_id BETWEEN :lo AND :lo + :block - 1 AND state = 'scheduled';
INSERT INTO order_events (order_id, at, event, actor, from_status, to_status, detail)
 SELECT id, now(), 'pay_timeout', 'timer', 'pending_payment', 'cancelled_unpaid', NULL
 FROM orders WHERE id BETWEEN :lo AND :lo + :block - 1;
UPDATE timers SET state = 'done', outcome = 'cancelled', done_at = now(), lease_until = NULL
 WHERE id BETWEEN :lo AND :lo + :block - 1 AND claim_token = 'bench' AND state = 'claimed';
COMMIT;
