"""`manage.py apply`: the operator's classifications of what the billing inventory does not
list (catalog/classifications.py), deployment-wide or for one organization of the file or the
database, each checked by the API's serializer first. `apply` is the operator.

    classifications:
      - {endpoint: messages, what: beta, name: some-new-beta, cls: free, reason: "reports more of the same"}
      - {organization: demo, endpoint: responses, what: field, name: new_option, cls: refused, reason: "..."}
"""

from __future__ import annotations

from catalog.classification_api import ClassificationSerializer
from catalog.classifications import classify
from catalog.models import Classification
from dashboard.services.apply import APPLY, ApplyResult, Change, _guard, _Item, validated

FIELDS = {"organization", "endpoint", "what", "name", "cls", "reason"}
REQUIRED = {"endpoint", "what", "name", "cls", "reason"}


def apply_classification(item: _Item, result: ApplyResult) -> None:
    fields = validated(item, ClassificationSerializer, dict(item.data))
    org = fields.get("organization")
    label = f"{org.slug if org else 'deployment'} {fields['endpoint']} {fields['what']} {fields['name']}"
    before = Classification.objects.filter(
        organization=org, endpoint=fields["endpoint"], what=fields["what"], name=fields["name"]
    ).first()
    with _guard(item.path):
        classify(
            actor=APPLY,
            organization=org,
            endpoint=fields["endpoint"],
            what=fields["what"],
            name=fields["name"],
            cls=fields["cls"],
            reason=fields["reason"],
        )
    if before is None:
        result.changes.append(Change("create", "classification", label))
    elif (before.cls, before.reason) != (fields["cls"], fields["reason"]):
        changes = {k: [getattr(before, k), fields[k]] for k in ("cls", "reason") if getattr(before, k) != fields[k]}
        result.changes.append(Change("update", "classification", label, changes))
