"""docker-compose.yml, parsed: each service's image, command and healthcheck, and that the
app's commands exist in the image (installed package: `django-admin`, never manage.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from tests.deploy import dockerfiles

ROOT = Path(__file__).resolve().parents[2]
APP = ("web", "worker", "beat")


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def _words(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def _test(service: dict) -> str:
    return " ".join(service["healthcheck"]["test"])


def test_each_service_has_an_image_or_is_built_from_this_repository(services):
    assert set(services) == {"postgres", "redis", "mailpit", "tokens", *APP}
    for name in (*APP, "tokens"):
        assert services[name]["build"] == "." and "image" not in services[name], name
    assert services["postgres"]["image"] == "postgres:15"
    assert services["redis"]["image"] == "redis:7"
    assert services["mailpit"]["image"].startswith("axllent/mailpit:")


def test_commands(services):
    web = _words(services["web"]["command"])
    assert web[:2] == ["sh", "-c"]
    steps = [s.strip() for s in web[2].split("&&")]
    # migrations and prices before the server; uvicorn replaces the shell (signals reach it)
    assert steps[0] == "django-admin migrate --noinput"
    assert steps[1] == "django-admin load_prices"
    assert steps[-1].startswith("exec uvicorn config.asgi:application --host 0.0.0.0 --port 8000 --workers ")
    assert _words(services["worker"]["command"])[:4] == ["celery", "-A", "config", "worker"]
    assert _words(services["beat"]["command"])[:4] == ["celery", "-A", "config", "beat"]
    assert _words(services["postgres"]["command"]) == ["postgres", "-c", "max_connections=600"]
    # the token counter serves the socket the web workers are told of, on a volume they share
    counter = _words(services["tokens"]["command"])
    assert counter[:4] == ["python", "-m", "gateway.admission.token_counter", "serve"]
    socket = counter[counter.index("--socket") + 1]
    assert services["web"]["environment"]["CAPGATE_TOKEN_COUNTER"] == socket
    for name in ("tokens", "web"):
        (volume,) = services[name]["volumes"]
        assert volume == f"tokens:{Path(socket).parent}", name


def test_app_commands_exist_in_the_installed_image(services):
    # The image has no source tree: manage.py is not there, django-admin is (Dockerfile).
    text = (ROOT / "docker-compose.yml").read_text()
    assert "manage.py" not in text
    commands = get_commands()
    for name in APP:
        words = _words(services[name]["command"])
        script = words[2] if words[:2] == ["sh", "-c"] else " ".join(words)
        for step in script.split("&&"):
            parts = step.split()
            if parts and parts[0] == "django-admin":
                assert parts[1] in commands, step
    # the documented follow-up
    assert "django-admin apply deploy/demo.yaml" in text
    assert "apply" in commands


def test_healthchecks(services):
    assert _test(services["postgres"]) == "CMD pg_isready -U capgate"
    assert _test(services["redis"]) == "CMD redis-cli ping"
    # web is ready when /readyz answers 200 (database, migrations, spool); curl is in the image
    assert _test(services["web"]) == "CMD curl -fsS -o /dev/null http://127.0.0.1:8000/readyz"
    assert services["web"]["healthcheck"]["start_period"]
    _build, runtime = dockerfiles.stages(ROOT / "Dockerfile")
    assert any("install" in r and " curl" in r for r in runtime.all("RUN"))
    # the worker answers a ping by its own node name ($$ is compose's escape for the shell's $)
    assert _test(services["worker"]).startswith("CMD-SHELL celery -A config inspect ping -d celery@$$HOSTNAME ")
    # the token counter answers `check` on the socket it serves (exit 0) or fails it (exit 1)
    counter = services["tokens"]
    assert counter["healthcheck"]["test"] == [
        "CMD",
        *_words(counter["command"])[:3],
        "check",
        "--socket",
        services["web"]["environment"]["CAPGATE_TOKEN_COUNTER"],
    ]
    # beat answers no ping (it only sends); mailpit's image carries its own healthcheck
    assert "healthcheck" not in services["beat"] and "healthcheck" not in services["mailpit"]


def test_app_services_start_after_their_dependencies_are_healthy(services):
    for name in APP:
        needs = services[name]["depends_on"]
        assert needs["postgres"] == {"condition": "service_healthy"}, name
        assert needs["redis"] == {"condition": "service_healthy"}, name
    # web counts through the counter; the counter itself needs nothing
    assert services["web"]["depends_on"]["tokens"] == {"condition": "service_healthy"}
    assert "depends_on" not in services["tokens"]
    for name in ("worker", "beat"):  # never against unapplied migrations
        assert services[name]["depends_on"]["web"] == {"condition": "service_healthy"}
    # production settings refuse to start without both secrets: compose refuses first
    environment = services["web"]["environment"]
    assert environment["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")
    assert environment["CAPGATE_SECRET_KEY"].startswith("${CAPGATE_SECRET_KEY:?")


def test_every_long_running_service_is_restarted_when_it_exits(services):
    """A worker or beat that dies must come back (docs/operations.md, "Supervision"): Docker
    restarts a service with a restart policy, with its own backoff, and `docker compose stop`
    still stops it."""
    assert {name: service.get("restart") for name, service in services.items()} == dict.fromkeys(
        services, "unless-stopped"
    )
