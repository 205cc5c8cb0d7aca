"""The OpenAPI schema groups operations by resource: one tag each, named like its URL."""

import pytest
import yaml

pytestmark = pytest.mark.django_db


def test_every_operation_has_one_resource_tag(client):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    tags: dict[str, set[str]] = {}
    for path, operations in schema["paths"].items():
        if path == "/api/schema/":
            continue
        for method, op in operations.items():
            assert len(op.get("tags", [])) == 1, (method, path, op.get("tags"))
            tags.setdefault(op["tags"][0], set()).add(path)
    assert {
        "organizations",
        "projects",
        "keys",
        "end-customers",
        "budgets",
        "routes",
        "prices",
        "usage",
        "reservations",
        "alert-channels",
    } <= set(tags)
    assert all(p.startswith("/api/orgs/{org_slug}/keys/") for p in tags["keys"])
    assert "api" not in tags and "orgs" not in tags
