"""Every write to a table the gateway's lookup cache reads from (gateway/admission/routing.py
`lookups`: keys, routes and their targets, connections, models and prices, rate limits,
classifications) notifies every gateway process: `pg_notify('capgate_cache', 'lookups:*')`, once
per statement, from the writing transaction (delivered at its commit, never for a rollback). The
processes empty the whole lookup cache: these writes are administrative and rare.
"""

from django.db import migrations

TABLES = [
    "tenants_organization",
    "tenants_project",
    "tenants_member",
    "tenants_apikey",
    "catalog_provider",
    "catalog_model",
    "catalog_connection",
    "catalog_route",
    "catalog_routetarget",
    "catalog_classification",
    "ratelimits_ratelimit",
]

FUNCTION = """
CREATE FUNCTION capgate_lookup_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('capgate_cache', 'lookups:*');
    RETURN NULL;
END
$$;
"""


def _triggers(table: str) -> str:
    return (
        f"CREATE TRIGGER capgate_lookup_notice AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION capgate_lookup_notice();"
    )


FORWARD = FUNCTION + "\n".join(_triggers(t) for t in TABLES)
BACKWARD = "\n".join(f"DROP TRIGGER IF EXISTS capgate_lookup_notice ON {t};" for t in TABLES) + (
    "\nDROP FUNCTION IF EXISTS capgate_lookup_notice();"
)


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0001_stored_response"),
        ("tenants", "0004_audit_without_organization"),
        ("catalog", "0011_model_fast_mode_multiplier"),
        ("ratelimits", "0002_requests_per_minute_holds_the_maximum"),
    ]
    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
