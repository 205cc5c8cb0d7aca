"""Anthropic: `/v1/messages` with the key in `x-api-key`, `anthropic-version`, and the client's
classified `anthropic-*` headers (betas) passed on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway import billing
from gateway.providers.base import Adapter, register

if TYPE_CHECKING:
    from gateway.admission.routing import Target

ANTHROPIC_VERSION = "2023-06-01"


def beta_headers(client_headers: dict[str, str]) -> dict[str, str]:
    """Only the headers the billing inventory classifies (their values were checked when the
    request was shaped)."""
    return {name: client_headers[name] for name in billing.HEADERS["messages"] if name in client_headers}


class Anthropic(Adapter):
    endpoints = frozenset({"messages"})
    jobs = frozenset({"message_batches"})
    default_base_url = "https://api.anthropic.com"
    counts_tokens = True

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        headers["x-api-key"] = target.connection.plain_secret
        headers.update(beta_headers(client_headers))
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)


register("anthropic", Anthropic())
