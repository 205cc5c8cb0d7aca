"""Anthropic's fast mode (`speed: "fast"`): priced by the catalog's fast-mode multiplier, loaded
from genai-prices' `speed: fast` variants; reserved at it under a blocking cap, recorded at the
speed the provider's usage reports, refused under a cap on a model without one."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from genai_prices.data import providers as genai_providers

from catalog.genai import _multiple, genai_catalog
from ledger.models import UsageRecord
from tests.gateway.conftest import KEY, assert_nothing_held, wait_settled

AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
BODY = {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
FAST = 2  # the test model's fast-mode multiplier


def test_the_catalog_loads_fast_mode_from_every_genai_prices_speed_variant():
    # given: genai-prices' own models with a `speed: fast` price
    at = datetime.datetime.now(datetime.UTC)
    fast = {}
    for provider in genai_providers:
        for info in provider.models:
            for variant in info.price_variants or ():
                active = variant.constraint is None or variant.constraint.active(at)
                if variant.when.get("speed") == "fast" and active:
                    fast[(provider.id, info.id)] = (info, variant)
    assert fast, "genai-prices has no fast-mode price: the loader test would prove nothing"
    overlay = json.loads((Path(__file__).resolve().parents[2] / "catalog/data/prices.json").read_text())
    # when: the catalog is built
    catalog, skipped = genai_catalog(at=at, overlay=overlay)
    entries = {(m["provider"], m["name"]): m for m in catalog["models"]}
    skipped_names = {(s.provider, s.name) for s in skipped}
    # then: each loaded one carries its multiple of the standard rates, never below the provider's
    for key, (info, variant) in fast.items():
        if key in skipped_names:
            continue
        entry = entries[key]
        standard = info.prices if not isinstance(info.prices, list) else None
        assert "fast_mode_multiplier" in entry, key
        multiple = Decimal(entry["fast_mode_multiplier"])
        assert multiple > 1
        if standard is not None:
            assert multiple == _multiple(standard, variant.prices)
            assert variant.prices.input_mtok <= standard.input_mtok * multiple


FAST_BODY = {**BODY, "speed": "fast"}


@pytest.fixture
def fast_model(wired):
    wired.model.fast_mode_multiplier = Decimal(FAST)
    wired.model.save()
    return wired


def _post(gateway, body: dict, **upstream: str) -> httpx.Response:
    headers = {**AUTH, "anthropic-beta": "fast-mode-2026-02-01"}
    headers |= {f"X-Upstream-{k}": v for k, v in upstream.items()}
    return httpx.post(gateway.url + "/v1/messages", json=body, headers=headers, timeout=30)


def _record(resp: httpx.Response) -> UsageRecord:
    assert resp.status_code == 200, resp.text
    wait_settled()
    return UsageRecord.objects.get(request_id=resp.headers["x-capgate-request-id"])


def _at_standard_price(gateway, wired, **upstream: str) -> UsageRecord:
    """The fast request's record with a multiplier of 1: the same body at the standard rates."""
    wired.model.fast_mode_multiplier = Decimal(1)
    wired.model.save()
    try:
        return _record(_post(gateway, FAST_BODY, **upstream))
    finally:
        wired.model.fast_mode_multiplier = Decimal(FAST)
        wired.model.save()


def test_fast_mode_is_reserved_and_recorded_at_its_multiplier_under_a_blocking_cap(gateway, fast_model):
    # given a blocking cap, and what the request reserves and costs at the standard rates
    fast_model.budget(amount="5")
    standard = _at_standard_price(gateway, fast_model, completion_tokens="max")
    # when it is sent at fast speed
    fast = _record(_post(gateway, FAST_BODY, completion_tokens="max"))
    # then it reserves and costs the multiple (rounding up the worst case, half-up the cost)
    assert abs(fast.reserved_nano - FAST * standard.reserved_nano) <= FAST
    assert abs(fast.cost_nano - FAST * standard.cost_nano) <= FAST
    assert 0 < fast.cost_nano <= fast.reserved_nano
    assert fast.status == "served" and fast.error == ""


def test_a_fast_request_served_at_standard_speed_is_recorded_at_standard(gateway, fast_model):
    fast_model.budget(amount="5")
    standard = _at_standard_price(gateway, fast_model, completion_tokens="max")
    # when fast mode is unavailable and the provider reports the standard speed
    fell_back = _record(_post(gateway, FAST_BODY, completion_tokens="max", speed="standard"))
    # then it reserved the fast worst case but is charged what the provider billed
    assert fell_back.reserved_nano > standard.reserved_nano
    assert fell_back.cost_nano == standard.cost_nano


def test_fast_mode_without_a_multiplier_is_refused_under_a_cap_and_holds_nothing(gateway, wired):
    wired.budget(amount="5")
    resp = _post(gateway, FAST_BODY)
    assert resp.status_code == 402
    assert resp.json()["type"] == "error"
    assert "speed_under_budget" in resp.text and "fast mode" in resp.text
    assert_nothing_held()


def test_fast_mode_without_a_cap_is_recorded_at_its_multiplier(gateway, fast_model):
    standard = _at_standard_price(gateway, fast_model, completion_tokens="max")
    fast = _record(_post(gateway, FAST_BODY, completion_tokens="max"))
    assert abs(fast.cost_nano - FAST * standard.cost_nano) <= FAST
