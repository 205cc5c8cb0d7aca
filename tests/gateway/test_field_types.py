"""The type table every request field is checked against before admission
(gateway/admission/field_types.py FIELD_TYPES) against the official SDKs' request TypedDicts: a field
whose type an SDK changes, or a new field, fails here instead of reaching sizing unchecked."""

from __future__ import annotations

import pytest

from gateway import billing
from gateway.admission.field_types import FIELD_TYPES, json_type_ok
from tests.gateway.sdk_types import SDK_PARAMS, sdk_field_types


def test_every_inventory_field_has_a_type():
    assert {k: set(v) for k, v in FIELD_TYPES.items()} == {k: set(v) for k, v in billing.FIELDS.items()}


@pytest.mark.parametrize("kind", sorted(SDK_PARAMS))
def test_each_fields_type_is_the_sdks(kind):
    sdk = sdk_field_types(kind)
    ours = {name: set(types) for name, types in FIELD_TYPES[kind].items() if name in sdk}
    # a number field takes integers too (JSON has one number type); the SDKs say float
    assert ours == {name: sdk[name] for name in ours}, kind


@pytest.mark.parametrize(
    "value,types,ok",
    [
        (True, ("integer",), False),
        (True, ("number",), False),
        (True, ("boolean",), True),
        (1, ("number",), True),
        (1.5, ("integer",), False),
        ("x", ("object",), False),
        (["x"], ("object",), False),
        ({}, ("string", "object"), True),
        (None, ("array",), True),
    ],
)
def test_json_types(value, types, ok):
    assert json_type_ok(value, types) is ok
