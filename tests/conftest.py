"""The cast: an organization with a project and keys, and an outsider organization."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from django.contrib.auth import get_user_model

from ledger.admission import AdmissionRequest, Subject, admit
from ledger.models import Budget, Window
from tenants.models import ApiKey, Organization, Project

_ids = itertools.count()


def usd(amount: str | float) -> int:
    from decimal import Decimal

    return int(Decimal(str(amount)) * 1_000_000_000)


@dataclass
class Tenant:
    org: Organization
    project: Project
    key: ApiKey
    keys: list[ApiKey] = field(default_factory=list)

    def subject(self, key: ApiKey | None = None, **extra) -> Subject:
        key = key or self.key
        return Subject(organization_id=self.org.id, project_id=key.project_id, api_key_id=key.id, **extra)

    def request(
        self, request_id: str | None = None, *, worst_nano: int, key: ApiKey | None = None, **kw
    ) -> AdmissionRequest:
        return AdmissionRequest(
            subject=kw.pop("subject", None) or self.subject(key),
            request_id=request_id or f"req-{next(_ids)}",
            worst_nano=worst_nano,
            **kw,
        )

    def admit(self, **kw):
        return admit(request=self.request(**kw))

    def budget(
        self, *, amount: str, scope: str = "organization", mode: str = "block", period: str = "month", **kw
    ) -> Budget:
        return Budget.objects.create(
            organization=self.org, scope=scope, mode=mode, period=period, amount_nano=usd(amount), **kw
        )

    def add_key(self, name: str, project: Project | None = None) -> ApiKey:
        raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(
            organization=self.org, project=project or self.project, name=name, prefix=prefix, key_hash=digest
        )
        self.keys.append(key)
        return key


def make_tenant(slug: str) -> Tenant:
    org = Organization.objects.create(name=slug.title(), slug=slug)
    project = Project.objects.create(organization=org, name="Main", slug="main")
    raw, prefix, digest = ApiKey.generate()
    key = ApiKey.objects.create(organization=org, project=project, name="default", prefix=prefix, key_hash=digest)
    return Tenant(org=org, project=project, key=key, keys=[key])


@pytest.fixture
def acme(db) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def outsider(db) -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", "alice@example.com", "password")


def window_of(budget: Budget) -> Window:
    return Window.objects.get(budget=budget)
