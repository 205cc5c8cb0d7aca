"""A budget write's cache notice names the subject the budget covers, not only its organization:
`budgets:<organization id>:<subject column>:<value>` (a project, member, key, end customer or
run budget), `budgets:<organization id>` (an organization budget, or a row whose subject is
unknown), `budgets:*` (a TRUNCATE). A gateway process then drops only the cached budgets of
subjects that budget can cover (ledger/budget_cache.py), so a run's or a new end customer's
budget, created on its first call, leaves every other subject's cached budgets in place.

An UPDATE names its old row's subject and its new one (the same notice when the subject did not
change: Postgres delivers one per distinct payload per transaction), so even a write that moves
a budget to another subject by hand (psql) reaches the entries of both. The column names are
those of ledger/scopes.py; tests/gateway/test_budget_notice_scope.py checks every scope's notice.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION capgate_budget_notice_payload(b budgets_budget) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'budgets:' || b.organization_id || coalesce(':' || CASE b.scope
        WHEN 'project' THEN 'project_id:' || b.project_id
        WHEN 'member' THEN 'member_id:' || b.member_id
        WHEN 'key' THEN 'api_key_id:' || b.api_key_id
        WHEN 'end_customer' THEN 'end_customer_id:' || b.end_customer_id
        WHEN 'run' THEN 'run_id:' || b.run_id
    END, '')
$$;
CREATE OR REPLACE FUNCTION capgate_budget_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('capgate_cache', 'budgets:*');
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        PERFORM pg_notify('capgate_cache', capgate_budget_notice_payload(OLD));
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM pg_notify('capgate_cache', capgate_budget_notice_payload(NEW));
    END IF;
    RETURN NULL;
END
$$;
"""

# 0002's function, as it was.
BACKWARD = """
CREATE OR REPLACE FUNCTION capgate_budget_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('capgate_cache', 'budgets:*');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('capgate_cache', 'budgets:' || OLD.organization_id);
    ELSE
        PERFORM pg_notify('capgate_cache', 'budgets:' || NEW.organization_id);
    END IF;
    RETURN NULL;
END
$$;
DROP FUNCTION IF EXISTS capgate_budget_notice_payload(budgets_budget);
"""


class Migration(migrations.Migration):
    dependencies = [("ledger", "0005_periodic_run")]
    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
