"""What the billing inventory does not list, through the live gateway: refused with 400 under a
blocking cap (naming it and where to classify it); passed on, counted and noted where no
blocking budget applies; and classified by the deployment's operator (deployment-wide or for one
organization, the organization's winning) without a release."""

from __future__ import annotations

import httpx
import pytest

from catalog.classifications import classify
from catalog.models import Classification, ClassificationChange
from core.errors import InvalidChange, NotAllowed
from ledger.models import Reservation, UsageRecord
from tenants.audit import Actor
from tenants.models import AuditLogEntry
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = {"authorization": f"Bearer {KEY}"}
OPERATOR = Actor(label="ops@capgate.localhost", operator=True)
CHAT = {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def _post(gateway, body: dict, path: str = "/v1/chat/completions", headers: dict | None = None) -> httpx.Response:
    return httpx.post(gateway.url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=30)


def _metric(gateway, endpoint: str, name: str) -> float:
    wanted = f'capgate_unclassified_total{{endpoint="{endpoint}",name="{name}"}}'
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("alert_budget", [False, True], ids=["no-budget", "alert-only"])
def test_with_no_blocking_budget_an_unknown_field_is_forwarded_counted_and_noted(
    gateway, wired, upstream, alert_budget
):
    if alert_budget:
        wired.budget(amount="5", mode="alert")
    before = _metric(gateway, "chat", "field:brand_new_option")
    resp = _post(gateway, {**CHAT, "brand_new_option": {"level": 3}})
    assert resp.status_code == 200, resp.text
    assert upstream.last("/v1/chat/completions")["body"]["brand_new_option"] == {"level": 3}
    assert _metric(gateway, "chat", "field:brand_new_option") == before + 1
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "served"
    assert "unclassified: field:brand_new_option" in rec.error


def test_with_no_blocking_budget_unknown_tools_and_betas_reach_the_provider_and_headers_stay(gateway, wired, upstream):
    headers = {"anthropic-beta": "something-new-2099-01-01", "anthropic-priority-lane": "yes"}
    body = {**MESSAGES, "tools": [{"type": "future_tool_20991231", "name": "x"}]}
    resp = _post(gateway, body, "/v1/messages", headers)
    assert resp.status_code == 200, resp.text
    sent = upstream.last("/v1/messages")
    assert sent["body"]["tools"] == [{"type": "future_tool_20991231", "name": "x"}]
    assert "something-new-2099-01-01" in sent["headers"]["anthropic-beta"]
    assert "anthropic-priority-lane" not in sent["headers"]  # only listed headers are forwarded
    wait_settled()
    note = UsageRecord.objects.get().error
    for name in ("tool:future_tool_20991231", "beta:something-new-2099-01-01", "header:anthropic-priority-lane"):
        assert name in note
        assert _metric(gateway, "messages", name) >= 1


def test_under_a_blocking_cap_it_is_a_400_naming_it_and_where_to_classify(gateway, wired, upstream):
    wired.budget(amount="5")
    resp = _post(gateway, {**CHAT, "brand_new_option": 1})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", "brand_new_option")
    assert "/api/classifications/" in err["message"] and "manage.py apply" in err["message"]
    assert upstream.stats()["requests"] == 0
    assert not UsageRecord.objects.exists() and not Reservation.objects.exists()


def test_the_operators_classification_applies_without_a_release(gateway, wired, upstream):
    # given: a blocking cap, and a field nobody has classified
    wired.budget(amount="5")
    body = {**CHAT, "brand_new_option": 1}
    assert _post(gateway, body).status_code == 400
    # when: the operator classifies it free for the deployment
    classify(
        actor=OPERATOR,
        organization=None,
        endpoint="chat",
        what="field",
        name="brand_new_option",
        cls="free",
        reason="a label",
    )
    # then: admitted under the cap, and not counted as unclassified
    resp = _post(gateway, body)
    assert resp.status_code == 200, resp.text
    wait_settled()
    assert "unclassified" not in UsageRecord.objects.get().error
    # and the organization's own class wins over the deployment's: refused under its cap
    classify(
        actor=OPERATOR,
        organization=wired.org,
        endpoint="chat",
        what="field",
        name="brand_new_option",
        cls="refused",
        reason="it buys a paid feature here",
    )
    resp = _post(gateway, body)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "brand_new_option_under_budget"


def test_a_beta_is_classified_by_its_name_without_the_date(gateway, wired, upstream):
    wired.budget(amount="5")
    classify(
        actor=OPERATOR, organization=None, endpoint="messages", what="beta", name="shiny", cls="tokens", reason="r"
    )
    resp = _post(gateway, MESSAGES, "/v1/messages", {"anthropic-beta": "shiny-2099-01-01"})
    assert resp.status_code == 200, resp.text


def test_only_the_operator_classifies_and_every_change_is_audited(wired):
    owner = Actor(label="owner@acme.example")
    with pytest.raises(NotAllowed):
        classify(actor=owner, organization=wired.org, endpoint="chat", what="field", name="x", cls="free", reason="r")
    classify(actor=OPERATOR, organization=wired.org, endpoint="chat", what="field", name="x", cls="free", reason="r")
    classify(actor=OPERATOR, organization=wired.org, endpoint="chat", what="field", name="x", cls="refused", reason="s")
    row = Classification.objects.get()
    assert (row.cls, row.reason, row.updated_by) == ("refused", "s", "ops@capgate.localhost")
    trail = [(c.cls_before, c.cls_after, c.organization_slug) for c in ClassificationChange.objects.order_by("id")]
    assert trail == [("", "free", "acme"), ("free", "refused", "acme")]
    assert AuditLogEntry.objects.filter(organization=wired.org, object_type="classification").count() == 2


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"endpoint": "videos"}, "endpoint"),
        ({"what": "cookie"}, "what"),
        ({"name": "has space"}, "name"),
        ({"what": "header", "name": "X-Upper"}, "name"),
        ({"cls": "priced"}, "cls"),
        ({"reason": "  "}, "reason"),
    ],
)
def test_a_bad_classification_is_refused_naming_the_field_and_changes_nothing(wired, change, param):
    fields = {"endpoint": "chat", "what": "field", "name": "x", "cls": "free", "reason": "r", **change}
    with pytest.raises(InvalidChange) as refused:
        classify(actor=OPERATOR, organization=None, **fields)
    assert refused.value.param == param
    assert not Classification.objects.exists() and not ClassificationChange.objects.exists()


def test_without_the_refusal_under_a_cap_an_unlisted_paid_option_overspends_it(gateway, wired, upstream, monkeypatch):
    # given: a $0.05 cap and an unlisted option that (like a new paid feature) makes the provider
    # bill ten times the output the bound allowed for
    from gateway.admission import unclassified

    budget = wired.budget(amount="0.05")
    upstream.control(completion_tokens="max", overbill=10)
    body = {**CHAT, "max_tokens": 100, "brand_new_paid_option": True}
    # with the guard: refused before the provider, nothing spent
    assert _post(gateway, body).status_code == 400
    assert upstream.stats()["requests"] == 0
    # when the guard is removed (unclassified names pass even under a cap)
    real = unclassified.decide
    monkeypatch.setattr(
        unclassified,
        "decide",
        lambda *, shape, organization_id, blocking: real(shape=shape, organization_id=organization_id, blocking=False),
    )
    assert _post(gateway, body).status_code == 200
    # then: the provider billed past the cap
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.cost_nano > budget.amount_nano > rec.reserved_nano
