"""Deployment files: compose waits on health (the gateway's /readyz), alert emails land in the
dev SMTP catcher, and the image's build context leaves out secrets and local state."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_healthchecks_and_start_order():
    services = compose()["services"]
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])
    assert services["redis"]["healthcheck"] and services["postgres"]["healthcheck"]
    for name in ("worker", "beat"):
        # their own depends_on replaces the anchor's: all four must be listed
        assert services[name]["depends_on"]["web"] == {"condition": "service_healthy"}
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert "redis" in services[name]["depends_on"]


def test_alert_emails_go_to_mailpit_by_default():
    services = compose()["services"]
    assert services["mailpit"]["image"].startswith("axllent/mailpit")
    assert "8025:8025" in services["mailpit"]["ports"]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert (env["EMAIL_HOST"], env["EMAIL_PORT"]) == ("${EMAIL_HOST:-mailpit}", "${EMAIL_PORT:-1025}")


def test_dockerignore_keeps_secrets_and_local_state_out_of_the_image():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".env", "var", "**/__pycache__"} <= ignored
    assert "!.env.example" in ignored
