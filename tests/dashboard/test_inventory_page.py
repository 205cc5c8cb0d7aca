"""The Unclassified page: an organization's members see what its requests passed unclassified
and the classifications that apply; only staff classify (for the organization or the
deployment), an outsider gets 404 and changes nothing, a bad value is a form error."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from catalog.models import Classification, ClassificationChange
from ledger.models import UsageRecord
from tests.api.conftest import Org

from .test_dashboard import browser

POST = {"scope": "organization", "endpoint": "chat", "what": "field", "name": "brand_new", "cls": "free", "reason": "r"}


def _seen(org: Org, note: str) -> None:
    UsageRecord.objects.create(
        request_id=f"req_{note}",
        organization=org.tenant.org,
        status="served",
        admitted_at=timezone.now(),
        error=f"unclassified: {note}",
    )


@pytest.mark.django_db
def test_members_see_what_passed_unclassified_and_cannot_classify(org_a: Org, role_users):
    _seen(org_a, "field:brand_new, beta:shiny-2099-01-01")
    _seen(org_a, "field:brand_new")
    url = reverse("dashboard:inventory", args=[org_a.slug])
    page = browser(org_a.owner).get(url)
    assert page.status_code == 200
    assert page.context["seen"] == [("field:brand_new", 2), ("beta:shiny-2099-01-01", 1)]
    assert page.context["form"] is None  # an owner is not the operator
    assert browser(org_a.owner).post(url, POST).status_code == 403
    assert browser(role_users["viewer"][0]).post(url, POST).status_code == 403
    assert not Classification.objects.exists()


@pytest.mark.django_db
def test_staff_classify_for_the_organization_or_the_deployment(org_a: Org):
    org_a.owner.is_staff = True
    org_a.owner.save()
    c = browser(org_a.owner)
    url = reverse("dashboard:inventory", args=[org_a.slug])
    assert c.post(url, POST).status_code == 302
    assert c.post(url, {**POST, "scope": "deployment", "cls": "refused"}).status_code == 302
    assert sorted((str(r.organization_id or ""), r.cls) for r in Classification.objects.all()) == [
        ("", "refused"),
        (str(org_a.tenant.org.id), "free"),
    ]
    assert ClassificationChange.objects.count() == 2
    assert len(c.get(url).context["classifications"]) == 2


@pytest.mark.django_db
def test_a_bad_classification_is_a_form_error_and_changes_nothing(org_a: Org):
    org_a.owner.is_staff = True
    org_a.owner.save()
    r = browser(org_a.owner).post(reverse("dashboard:inventory", args=[org_a.slug]), {**POST, "name": "has space"})
    assert r.status_code == 200 and "name" in r.context["form"].errors
    assert not Classification.objects.exists()


@pytest.mark.django_db
def test_an_outsider_gets_404_even_as_staff(org_a: Org, org_b: Org):
    org_b.owner.is_staff = True
    org_b.owner.save()
    url = reverse("dashboard:inventory", args=[org_a.slug])
    assert browser(org_b.owner).get(url).status_code == 404
    assert browser(org_b.owner).post(url, POST).status_code == 404
    assert not Classification.objects.exists()
