"""Production refuses to start on settings that are only safe on a laptop.

Called from config/settings/prod.py: any failure raises ImproperlyConfigured before Django is
set up, so a gateway, worker or `manage.py` command with a missing or default secret key does not
start at all — rather than sign sessions and encrypt connection secrets with a key anyone can read
in this repository.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

# Every default this repository has shipped for a secret (settings, docker-compose.yml, docs).
KNOWN_DEFAULTS = frozenset({"dev-insecure-change-me", "change-me", "change-me-too", "changeme", "secret"})
HOW = 'generate one with: python -c "import secrets; print(secrets.token_urlsafe(50))"'


def require_secret(environ: Mapping[str, str], name: str, *, min_length: int) -> str:
    """The variable's value; refused when missing, a known default, or shorter than min_length.
    A comma-separated value (CAPGATE_SECRET_KEY's rotation list) is checked part by part."""
    value = environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} is not set: production refuses to start without it; {HOW}")
    for part in (p.strip() for p in value.split(",")):
        if part.lower() in KNOWN_DEFAULTS:
            raise ImproperlyConfigured(f"{name} is a published default value; {HOW}")
        if len(part) < min_length:
            raise ImproperlyConfigured(f"{name} is shorter than {min_length} characters; {HOW}")
    return value


def refuse_wildcard_hosts(hosts: list[str]) -> None:
    # With "*" any Host header is accepted, and Django builds absolute links (password reset,
    # invitations) from it: an attacker's host in a reset email.
    if not hosts or "*" in hosts:
        raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must name the hosts explicitly (not empty, not '*').")
