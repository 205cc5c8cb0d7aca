"""Lookup notices name the organization a write touched: `pg_notify('capgate_cache',
'lookups:<organization id>')`, from a row trigger in the writing transaction, so a gateway
process makes only that organization's cached keys, routes, rate limits and classifications
stale (gateway/admission/routing.py `lookups`). Before, every write sent `lookups:*` and each
process emptied the whole cache: one tenant's admin writes sent every tenant's next requests to
the database.

`lookups:*` is still sent where a write concerns every organization: the price catalog
(providers and models, read by every route), a classification for the whole deployment (no
organization), a route target whose route is already gone, and any TRUNCATE. Postgres delivers
one notice per distinct payload per transaction, so a statement writing many rows of one
organization sends one.
"""

from django.db import migrations

# table -> how a row names its organization: a column of its own, or `route_id` (a route
# target belongs to its route's organization).
BY_ROW = {
    "tenants_organization": "id",
    "tenants_project": "organization_id",
    "tenants_member": "organization_id",
    "tenants_apikey": "organization_id",
    "catalog_connection": "organization_id",
    "catalog_route": "organization_id",
    "catalog_routetarget": "route_id",
    "catalog_classification": "organization_id",
    "ratelimits_ratelimit": "organization_id",
}
# catalog_provider and catalog_model keep 0002's statement trigger (`lookups:*`): every
# organization's routes read them.

FUNCTION = """
CREATE FUNCTION capgate_lookup_row_notice() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    images jsonb[];
    r jsonb;
    org text;
BEGIN
    IF TG_OP = 'INSERT' THEN images := ARRAY[to_jsonb(NEW)];
    ELSIF TG_OP = 'DELETE' THEN images := ARRAY[to_jsonb(OLD)];
    ELSE images := ARRAY[to_jsonb(OLD), to_jsonb(NEW)];  -- moved between organizations: both
    END IF;
    FOREACH r IN ARRAY images LOOP
        IF TG_ARGV[0] = 'route_id' THEN
            SELECT organization_id::text INTO org FROM catalog_route WHERE id = (r ->> 'route_id')::bigint;
        ELSE
            org := r ->> TG_ARGV[0];
        END IF;
        PERFORM pg_notify('capgate_cache', 'lookups:' || coalesce(org, '*'));
    END LOOP;
    RETURN NULL;
END
$$;
"""


def _forward(table: str, column: str) -> str:
    return (
        f"DROP TRIGGER capgate_lookup_notice ON {table};\n"
        f"CREATE TRIGGER capgate_lookup_notice AFTER INSERT OR UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION capgate_lookup_row_notice('{column}');\n"
        f"CREATE TRIGGER capgate_lookup_truncate_notice AFTER TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION capgate_lookup_notice();"
    )


def _backward(table: str) -> str:
    return (
        f"DROP TRIGGER capgate_lookup_truncate_notice ON {table};\n"
        f"DROP TRIGGER capgate_lookup_notice ON {table};\n"
        f"CREATE TRIGGER capgate_lookup_notice AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION capgate_lookup_notice();"
    )


FORWARD = FUNCTION + "\n".join(_forward(t, c) for t, c in BY_ROW.items())
BACKWARD = "\n".join(_backward(t) for t in BY_ROW) + "\nDROP FUNCTION capgate_lookup_row_notice();"


class Migration(migrations.Migration):
    dependencies = [("gateway", "0002_lookup_notices")]
    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
