"""The API cast: acme's owner, admin, member and viewer, acme's read and write tokens (the
owner's), and globex — an outsider organization with its own owner, token and objects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from catalog.models import Connection, Model, Provider, Route, RouteTarget
from ledger.models import Budget, UsageRecord
from tenants.models import EndCustomer, Member
from tests.conftest import Tenant, make_api_token


@dataclass
class Org:
    tenant: Tenant
    owner: object
    token_write: str
    token_read: str
    budget: Budget
    connection: Connection
    route: Route
    customer: EndCustomer
    member_row: Member

    @property
    def slug(self) -> str:
        return self.tenant.org.slug


def make_token(member: Member, scope: str) -> str:
    """A token of `member` (the cast's tokens are the owner's: they act as admin or viewer)."""
    return make_api_token(organization=member.organization, member=member, scope=scope)


def user(email: str):
    return get_user_model().objects.create_user(email, email, "password")


def populate(tenant: Tenant, owner_email: str) -> Org:
    org = tenant.org
    owner = user(owner_email)
    member_row = Member.objects.create(organization=org, user=owner, role="owner")
    provider, _ = Provider.objects.get_or_create(slug="echo", defaults={"name": "Echo"})
    model, _ = Model.objects.get_or_create(
        provider=provider, name="echo-1", defaults={"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}
    )
    connection = Connection.objects.create(organization=org, name="echo", kind="echo", secret="sk-secret")
    route = Route.objects.create(organization=org, name="echo-1")
    RouteTarget.objects.create(route=route, connection=connection, model=model)
    customer = EndCustomer.objects.create(project=tenant.project, external_id="cust-1")
    budget = tenant.budget(amount="5", name="monthly")
    now = timezone.now()
    for i, (cost, key) in enumerate([(1_000_000, tenant.key), (2_500_000, tenant.key)]):
        UsageRecord.objects.create(
            request_id=f"{org.slug}-u{i}",
            organization=org,
            project=tenant.project,
            api_key=key,
            end_customer=customer if i else None,
            model="echo-1",
            status="served",
            input_tokens=10,
            output_tokens=20,
            cost_nano=cost,
            admitted_at=now - timedelta(days=i),
            applied=True,
        )
    return Org(
        tenant=tenant,
        owner=owner,
        token_write=make_token(member_row, "write"),
        token_read=make_token(member_row, "read"),
        budget=budget,
        connection=connection,
        route=route,
        customer=customer,
        member_row=member_row,
    )


@pytest.fixture
def org_a(acme) -> Org:
    return populate(acme, "owner@acme.test")


@pytest.fixture
def org_b(outsider) -> Org:
    return populate(outsider, "owner@globex.test")


@pytest.fixture
def role_users(org_a):
    """acme's admin, member (with a key of their own) and viewer."""
    users = {}
    for role in ("admin", "member", "viewer"):
        u = user(f"{role}@acme.test")
        users[role] = (u, Member.objects.create(organization=org_a.tenant.org, user=u, role=role))
    return users


def client(*, token: str | None = None, user=None) -> APIClient:
    c = APIClient()
    if token:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    if user is not None:
        c.force_authenticate(user=user)
    return c
