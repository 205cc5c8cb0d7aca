-- The classic admission transaction for a subject under 3 stacked blocking ceilings
-- (organization + project + key caps):
-- DESIGN §5's sketch, what admit() issued through commit 5216520, and the shape the issue's
-- reference numbers (~4,300/s at 1 client, ~1,760/s at 32) are for. The benchmark's target compares with it.
-- All 8 round trips of that admit(), with its SQL text (captured from Django): matching_budgets()
-- and ensure_windows() reads (autocommit), then BEGIN .. COMMIT.
-- Run by bench/admission.py (its pgbench-admit runner uses whichever script matches a trace of admit()):
--   pgbench -n -M simple -f bench/pgbench/admission_3_full.sql -c N -j N -T secs -D org=.. -D project=.. -D key=.. \
--           -D worst=.. -D w1=.. -D w2=.. -D w3=.. -D b1=.. -D b2=.. -D b3=.. -D pstart="'<period start>'::timestamptz"
-- Window ids ascending (the lock order). A random reservation id and request id per transaction.
\set r1 random(1, 4611686018427387903)
\set r2 random(1, 4611686018427387903)
SELECT "budgets_budget"."id", "budgets_budget"."organization_id", "budgets_budget"."name", "budgets_budget"."scope", "budgets_budget"."project_id", "budgets_budget"."member_id", "budgets_budget"."api_key_id", "budgets_budget"."end_customer_id", "budgets_budget"."run_id", "budgets_budget"."period", "budgets_budget"."timezone", "budgets_budget"."mode", "budgets_budget"."amount_nano", "budgets_budget"."thresholds", "budgets_budget"."recipients", "budgets_budget"."created_at", "budgets_budget"."updated_at" FROM "budgets_budget" WHERE (("budgets_budget"."scope" = 'organization' OR ("budgets_budget"."project_id" = :project AND "budgets_budget"."scope" = 'project') OR ("budgets_budget"."api_key_id" = :key AND "budgets_budget"."scope" = 'key')) AND "budgets_budget"."organization_id" = :org) ORDER BY "budgets_budget"."id" ASC;
SELECT "budgets_window"."budget_id" AS "budget_id", "budgets_window"."id" AS "id" FROM "budgets_window" WHERE (("budgets_window"."budget_id" = :b1 AND "budgets_window"."period_start" = :pstart) OR ("budgets_window"."budget_id" = :b2 AND "budgets_window"."period_start" = :pstart) OR ("budgets_window"."budget_id" = :b3 AND "budgets_window"."period_start" = :pstart));
BEGIN;
INSERT INTO "budgets_reservation" ("id", "request_id", "organization_id", "project_id", "member_id", "api_key_id", "end_customer_id", "run_id", "model", "amount_nano", "owner_id", "created_at", "expires_at", "deadline_at", "job_id") VALUES ((lpad(to_hex(:r1::bigint), 16, '0') || lpad(to_hex(:r2::bigint), 16, '0'))::uuid, 'pgbench-' || :r1::text || '-' || :r2::text, :org, :project, NULL, :key, NULL, NULL, '', :worst, NULL, now(), now() + interval '120 seconds', now() + interval '7200 seconds', NULL);
INSERT INTO "budgets_hold" ("reservation_id", "window_id", "amount_nano") SELECT * FROM UNNEST((array_fill((lpad(to_hex(:r1::bigint), 16, '0') || lpad(to_hex(:r2::bigint), 16, '0'))::uuid, ARRAY[3]))::uuid[], (ARRAY[:w1, :w2, :w3])::bigint[], (ARRAY[:worst, :worst, :worst])::bigint[]) RETURNING "budgets_hold"."id";
SELECT "budgets_window"."id" AS "id", "budgets_window"."budget_id" AS "budget_id", "budgets_budget"."scope" AS "budget__scope", "budgets_budget"."amount_nano" AS "budget__amount_nano", "budgets_window"."spent_nano" AS "spent_nano", "budgets_window"."reserved_nano" AS "reserved_nano" FROM "budgets_window" INNER JOIN "budgets_budget" ON ("budgets_window"."budget_id" = "budgets_budget"."id") WHERE "budgets_window"."id" IN (:w1, :w2, :w3) ORDER BY 1 ASC FOR NO KEY UPDATE OF "budgets_window";
UPDATE "budgets_window" SET "reserved_nano" = ("budgets_window"."reserved_nano" + :worst) WHERE "budgets_window"."id" IN (:w1, :w2, :w3);
COMMIT;
