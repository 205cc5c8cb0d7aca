"""/api/classifications/: the deployment operator (a staff user) lists and sets classifications of
what the billing inventory does not list; an organization's owner and its API tokens cannot
(403, nothing changed); a bad value is a 400 naming the field."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from catalog.models import Classification, ClassificationChange
from tests.api.conftest import make_token, populate
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db

URL = "/api/classifications/"
BETA = {"endpoint": "messages", "what": "beta", "name": "shiny", "cls": "free", "reason": "reports more"}


@pytest.fixture
def operator_client():
    staff = get_user_model().objects.create_user("ops@capgate.localhost", "ops@capgate.localhost", "pw", is_staff=True)
    client = APIClient()
    client.force_login(staff)
    return client


def test_the_operator_sets_and_lists_classifications_deployment_wide_and_per_organization(operator_client):
    acme = make_tenant("acme")
    resp = operator_client.post(URL, BETA, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["organization"] is None and resp.json()["updated_by"] == "ops@capgate.localhost"
    resp = operator_client.post(URL, {**BETA, "organization": "acme", "cls": "refused"}, format="json")
    assert resp.status_code == 201
    # posting the same scope and name again changes it in place
    resp = operator_client.post(URL, {**BETA, "reason": "changed my mind"}, format="json")
    assert resp.status_code == 201
    rows = operator_client.get(URL).json()["results"]
    assert sorted((r["organization"] or "", r["cls"], r["reason"]) for r in rows) == [
        ("", "free", "changed my mind"),
        ("acme", "refused", "reports more"),
    ]
    assert Classification.objects.filter(organization=acme.org).count() == 1
    assert ClassificationChange.objects.count() == 3


def test_an_owner_and_an_organization_token_cannot_classify(operator_client):
    org = populate(make_tenant("acme"), "owner@acme.example")
    owner = APIClient()
    owner.force_login(org.owner)
    assert owner.post(URL, {**BETA, "organization": "acme"}, format="json").status_code == 403
    assert owner.get(URL).status_code == 403
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(org.member_row, 'write')}")
    assert token.post(URL, {**BETA, "organization": "acme"}, format="json").status_code == 403
    assert APIClient().get(URL).status_code in (401, 403)
    assert not Classification.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"what": "cookie"}, "what"),
        ({"endpoint": "videos"}, "endpoint"),
        ({"cls": "priced"}, "cls"),
        ({"name": "has space"}, "name"),
        ({"organization": "nobody"}, "organization"),
        ({"reason": ""}, "reason"),
    ],
)
def test_a_bad_classification_is_a_400_naming_the_field(operator_client, change, field):
    resp = operator_client.post(URL, {**BETA, **change}, format="json")
    assert resp.status_code == 400
    assert field in resp.json()["errors"]
    assert not Classification.objects.exists()
