"""Azure OpenAI: each model under a deployment, `/openai/deployments/{name}/chat/completions`
with an `api-version`, and a resource key in `api-key` or a Microsoft Entra ID access token as a
bearer token. Bodies and usage are OpenAI's."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from gateway.providers.base import Adapter, register

if TYPE_CHECKING:
    from gateway.admission.routing import Target

AZURE_API_VERSION = "2024-10-21"  # the GA version whose streams report usage (include_usage)
PATHS = {"chat": "chat/completions", "embeddings": "embeddings"}


class AzureOpenAI(Adapter):
    endpoints = frozenset(PATHS)

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        """The deployment's URL with its api-version. The deployment is the one the connection
        maps the catalog model to, else the model's own name (Azure's default when a deployment
        is named after its model)."""
        options = target.connection.options
        deployment = (options.get("deployments") or {}).get(target.model.name) or target.model.name
        base = httpx.URL(target.connection.base_url)
        prefix = base.raw_path.decode("ascii").partition("?")[0].rstrip("/")
        path = f"{prefix}/openai/deployments/{quote(deployment, safe='')}/{PATHS[endpoint]}"
        version = options.get("api_version") or AZURE_API_VERSION
        return str(
            base.copy_with(raw_path=path.encode("ascii"), query=None, fragment=None).copy_set_param(
                "api-version", version
            )
        )

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        if target.connection.options.get("auth") == "entra":
            super().auth(target, client_headers, headers)
        else:
            headers["api-key"] = target.connection.plain_secret


register("azure_openai", AzureOpenAI())
