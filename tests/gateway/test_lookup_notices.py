"""The notices behind the lookup cache (gateway/migrations/0003): a committed write to any table
the cache reads sends `lookups:<organization>` for the organization it touched, or `lookups:*`
where it touches every organization's (the price catalog, a deployment-wide classification, a
TRUNCATE). Heard on a connection of their own that LISTENs, as a gateway process's listener does
(gateway/upstream/runtime.py); the cache's handling of them is in test_cache_notices.py."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import psycopg
import pytest
from django.db import connection

from catalog.models import Classification, Connection, Model, Provider, Route, RouteTarget
from core.invalidation import CHANNEL
from gateway.upstream.runtime import conninfo
from ratelimits.models import RateLimit
from tenants.models import ApiKey, Member

pytestmark = pytest.mark.django_db(transaction=True)

migration = importlib.import_module("gateway.migrations.0003_lookup_notices_per_organization")


@contextmanager
def heard() -> Iterator[list[str]]:
    """The lookup notices delivered while the block ran (its writes commit as they go)."""
    notes: list[str] = []
    with psycopg.connect(conninfo(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        yield notes
        notes.extend(n.payload for n in listener.notifies(timeout=0.5) if n.payload.startswith("lookups:"))


@pytest.fixture
def rows(acme, alice):
    """A row of acme's in every table the lookup cache reads: {table: id}."""
    provider = Provider.objects.create(slug="p", name="P")
    model = Model.objects.create(
        provider=provider, name="m-1", input_usd_per_mtok=Decimal(1), output_usd_per_mtok=Decimal(2)
    )
    conn = Connection.objects.create(organization=acme.org, name="c", kind="echo")
    route = Route.objects.create(organization=acme.org, name="m")
    target = RouteTarget.objects.create(route=route, connection=conn, model=model, position=0)
    member = Member.objects.create(organization=acme.org, user=alice)
    cls = Classification.objects.create(
        organization=acme.org, endpoint="chat", what="field", name="x", cls="free", reason="r", updated_by="t"
    )
    limit = RateLimit.objects.create(organization=acme.org, scope="organization", requests_per_minute=10)
    return {
        "tenants_organization": acme.org.id,
        "tenants_project": acme.project.id,
        "tenants_member": member.id,
        "tenants_apikey": acme.key.id,
        "catalog_connection": conn.id,
        "catalog_route": route.id,
        "catalog_routetarget": target.id,
        "catalog_classification": cls.id,
        "ratelimits_ratelimit": limit.id,
        "catalog_provider": provider.id,
        "catalog_model": model.id,
    }


def _touch(table: str, row_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET id = id WHERE id = %s", [row_id])  # fires the row's triggers


@pytest.mark.parametrize("table", sorted(migration.BY_ROW))
def test_a_write_to_an_organizations_row_names_that_organization(acme, rows, table):
    # when: one row of acme's is written
    with heard() as notes:
        _touch(table, rows[table])
    # then: one notice, for acme alone
    assert notes == [f"lookups:{acme.org.id}"]


@pytest.mark.parametrize("table", ["catalog_provider", "catalog_model"])
def test_a_price_catalog_write_names_every_organization(rows, table):
    with heard() as notes:
        _touch(table, rows[table])
    assert notes == ["lookups:*"]


def test_a_deployment_wide_classification_names_every_organization(db):
    with heard() as notes:
        Classification.objects.create(endpoint="chat", what="field", name="y", cls="free", reason="r", updated_by="t")
    assert notes == ["lookups:*"]


def test_keys_created_and_deleted_name_their_organization_once_per_transaction(acme, outsider):
    # when: two keys of acme's created in one statement, then one of the outsider's deleted
    with heard() as notes:
        ApiKey.objects.bulk_create(
            [
                ApiKey(organization=acme.org, project=acme.project, name=n, prefix=f"cg_{n}", key_hash=f"h{n}")
                for n in ("a", "b")
            ]
        )
        ApiKey.objects.filter(pk=outsider.key.pk).delete()
    # then: one notice per organization and transaction, each naming its own
    assert notes == [f"lookups:{acme.org.id}", f"lookups:{outsider.org.id}"]


def test_a_route_target_deleted_with_its_route_names_the_routes_organization(acme, rows):
    with heard() as notes:
        Route.objects.filter(pk=rows["catalog_route"]).delete()  # its targets go first, then the route
    assert set(notes) == {f"lookups:{acme.org.id}"}


def test_a_truncate_names_every_organization(rows):
    with heard() as notes, connection.cursor() as cursor:
        cursor.execute("TRUNCATE ratelimits_ratelimit")
    assert notes == ["lookups:*"]
