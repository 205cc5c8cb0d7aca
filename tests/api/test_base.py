"""The one base of the organization resources (tenants/api/base.py): every /api/orgs/{slug}/
resource is built on it, and its queryset scoping is the guard that keeps another organization's
ids out (the removal test below; its control is test_isolation's
test_objects_of_another_org_are_404_under_your_own_org)."""

from __future__ import annotations

import pytest

from config.api_urls import router
from ledger.models import Budget
from tenants.api.base import OrgViewSet

from .conftest import Org, client


def test_every_organization_resource_is_built_on_the_base():
    org_resources = {prefix: viewset for prefix, viewset, _ in router.registry if prefix.startswith("orgs/")}
    assert len(org_resources) >= 17
    assert [p for p, viewset in org_resources.items() if not issubclass(viewset, OrgViewSet)] == []


@pytest.mark.django_db
def test_org_scoping_removed_lets_one_org_read_and_delete_anothers_rows(org_a: Org, org_b: Org, monkeypatch):
    # given: the base's scoping replaced by every row of the model
    monkeypatch.setattr(OrgViewSet, "org_queryset", lambda self: self.model._default_manager.order_by("id"))
    c = client(token=org_a.token_write)
    detail = f"/api/orgs/{org_a.slug}/budgets/{org_b.budget.id}/"
    # when / then: acme's token reads and deletes globex's budget through acme's URL
    assert c.get(detail).status_code == 200
    assert c.delete(detail).status_code == 204
    assert not Budget.objects.filter(pk=org_b.budget.id).exists()
