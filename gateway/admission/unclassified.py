"""What the billing inventory does not list (request_fields.Unclassified), decided once the
request's key and budgets are known (gateway/admission/sizing.py calls `decide`).

1. The operator's classification (catalog/classifications.py), the organization's over the
   deployment's, matched on the exact name or, for tools and betas, the name without its date:
   free and tokens let it pass as classified; refused adds it to the fields refused under a
   blocking cap (402 naming it).
2. Still unclassified under a blocking budget: 400, naming it and where to classify it (an
   unknown parameter can change what the provider bills in a way the bound cannot see).
3. Still unclassified with no blocking budget on the request: passed on (fields, tools and
   betas reach the provider; an unlisted header is never forwarded), counted in
   capgate_unclassified_total and noted on the request's usage record.
"""

from __future__ import annotations

import dataclasses
from typing import cast

from catalog.classifications import classes_for
from gateway import billing
from gateway.admission.bounds import Shape
from gateway.admission.request_fields import Unclassified
from gateway.admission.routing import lookups
from gateway.http.errors import GatewayError

WHERE = (
    "The deployment's operator can classify it (POST /api/classifications/, or `classifications:` in a "
    "`manage.py apply` file; docs/billing.md)."
)


def _classes(organization_id: int) -> dict[tuple[str, str, str], str]:
    """Read through the gateway's lookup cache: a new classification applies within
    CAPGATE["LOOKUP_CACHE_SECONDS"] in every process."""
    key = ("classifications", organization_id)
    found = cast(dict[tuple[str, str, str], str] | None, lookups.get(key))
    if found is None:
        token = lookups.token()
        found = classes_for(organization_id=organization_id)
        lookups.put(key, found, token, organization_id=organization_id)
    return found


def _class_of(classes: dict[tuple[str, str, str], str], kind: str, item: Unclassified) -> str | None:
    names = [item.name]
    if item.what in ("tool", "beta"):
        names.append(billing.undated(item.name))
    return next((classes[(kind, item.what, n)] for n in names if (kind, item.what, n) in classes), None)


def _refused_name(item: Unclassified) -> str:
    if item.what == "beta":
        return "anthropic_beta"
    return billing.undated(item.name).replace("-", "_") if item.what == "tool" else item.name.replace("-", "_")


def decide(*, shape: Shape, organization_id: int, blocking: bool) -> Shape:
    if not shape.unclassified:
        return shape
    classes = _classes(organization_id)
    left: list[Unclassified] = []
    refused: list[str] = []
    for item in shape.unclassified:
        cls = _class_of(classes, shape.kind, item)
        if cls == billing.REFUSED:
            refused.append(_refused_name(item))
        elif cls is None:
            left.append(item)
    if blocking and left:
        first = left[0]
        raise GatewayError(
            f"{first.message} The billing inventory does not list it, so a blocking budget cannot admit the "
            f"request. {WHERE}",
            code=first.code,
            status=400,
            param=first.param,
        )
    return dataclasses.replace(shape, unclassified=tuple(left), refused=shape.refused + tuple(refused))


def labels(shape: Shape) -> list[str]:
    """`what:name` for each unclassified item, as the metric and the record's note name them."""
    return [f"{item.what}:{item.name}" for item in shape.unclassified]
