"""The README's demo: deploy/demo.yaml applied as scripts/up.sh applies it, then one Claude Code
and one Codex session with the demo key on the built-in echo provider, each served and recorded,
under the demo's blocking cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import Budget, Reservation, UsageRecord
from tests.clients import agents
from tests.gateway.conftest import wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo.yaml"
DEMO_KEY = "cg_demo_key_do_not_use_in_production"


@pytest.fixture
def demo(transactional_db, slices_mode):
    call_command("apply", str(DEMO), stdout=open("/dev/null", "w"))  # noqa: SIM115
    return Budget.objects.get(organization__slug="demo", mode="block")


def test_claude_code_and_codex_run_on_the_demo_under_its_cap(gateway, demo, tmp_path):
    # when: one session of each, as the README says
    claude = agents.claude(tmp_path / "claude", "Say hello", base_url=gateway.url, key=DEMO_KEY, model="echo-1")
    codex = agents.codex(tmp_path / "codex", "Say hello", base_url=gateway.url, key=DEMO_KEY, model="echo-1")
    # then: both were served
    assert claude.returncode == 0 and claude.json()["is_error"] is False, claude.output
    assert codex.returncode == 0, codex.output
    events = [json.loads(line) for line in codex.stdout.splitlines() if line.startswith("{")]
    assert any(e["type"] == "turn.completed" for e in events), codex.output
    # and each shows echo's answer (Codex builds it from the stream's output_item.done)
    assert claude.json()["result"].startswith("echo"), claude.output
    messages = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert messages and messages[-1].startswith("echo"), codex.output
    wait_settled()
    records = list(UsageRecord.objects.order_by("id"))
    assert [(r.status, r.model) for r in records] == [("served", "echo-1"), ("served", "echo-1")]
    assert sum(r.cost_nano for r in records) <= demo.amount_nano
    assert not Reservation.objects.exists()
