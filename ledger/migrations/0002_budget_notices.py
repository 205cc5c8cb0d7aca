"""Every write to budgets_budget notifies the gateway processes' budget caches (ledger/budget_cache.py):
`pg_notify('capgate_cache', 'budgets:<organization id>')` from the writing transaction, so the
notice is delivered when it commits and never for one that rolls back. A trigger, not code in
budgets.services, so that no writer (the ORM, `apply`, a migration, psql) can skip it.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION capgate_budget_notice() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER capgate_budget_notice AFTER INSERT OR UPDATE OR DELETE ON budgets_budget
    FOR EACH ROW EXECUTE FUNCTION capgate_budget_notice();
CREATE TRIGGER capgate_budget_truncate_notice AFTER TRUNCATE ON budgets_budget
    FOR EACH STATEMENT EXECUTE FUNCTION capgate_budget_notice();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS capgate_budget_truncate_notice ON budgets_budget;
DROP TRIGGER IF EXISTS capgate_budget_notice ON budgets_budget;
DROP FUNCTION IF EXISTS capgate_budget_notice();
"""


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
