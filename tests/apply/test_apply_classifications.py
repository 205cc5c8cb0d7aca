"""`manage.py apply` sets the operator's classifications (deployment-wide, or for an
organization of the file), idempotently, and reports a bad item with its path."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from catalog.models import Classification, ClassificationChange
from tests.apply.test_apply import run, write

pytestmark = pytest.mark.django_db

ITEM = {"endpoint": "responses", "what": "field", "name": "new_option", "cls": "free", "reason": "a label"}


def test_apply_classifies_for_the_deployment_and_for_an_organization_of_the_file(tmp_path):
    data = {
        "organizations": [{"slug": "acme", "name": "Acme"}],
        "classifications": [ITEM, {**ITEM, "organization": "acme", "cls": "refused"}],
    }
    out = run(write(tmp_path, data))
    assert "+ classification deployment responses field new_option" in out
    assert "+ classification acme responses field new_option" in out
    assert sorted(
        (slug or "", cls) for slug, cls in Classification.objects.values_list("organization__slug", "cls")
    ) == [
        ("", "free"),
        ("acme", "refused"),
    ]
    assert set(ClassificationChange.objects.values_list("actor", flat=True)) == {"apply"}
    # applying again changes nothing; a changed class is a diff
    assert run(write(tmp_path, data)).strip() == "no changes"
    data["classifications"][0]["cls"] = "tokens"
    assert "~ classification deployment responses field new_option: cls: free → tokens" in run(write(tmp_path, data))


def test_a_bad_classification_names_its_path_and_changes_nothing(tmp_path):
    data = {"classifications": [{**ITEM, "what": "cookie"}, {**ITEM, "colour": "red"}]}
    with pytest.raises(CommandError) as refused:
        run(write(tmp_path, data))
    assert "classifications[0].what" in str(refused.value)
    assert "classifications[1]: unknown field(s) colour" in str(refused.value)
    assert not Classification.objects.exists()
