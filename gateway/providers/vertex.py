"""Google Vertex AI: Claude through `:rawPredict` / `:streamRawPredict`, Gemini through Vertex's
OpenAI-compatible endpoint, both with a service account's OAuth token.

- Claude: `{base}/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict`
  (`:streamRawPredict` for a stream, whose answer is Anthropic's SSE). Body: the Messages body
  without `model`, with `anthropic_version: vertex-2023-10-16`.
- Gemini: `{base}/v1/projects/{project}/locations/{region}/endpoints/openapi/chat/completions`,
  the model named `google/{model}`. OpenAI's usage fields: Gemini's thinking tokens appear in
  `total_tokens` only (billed as output, gateway/providers/usage.py); cached tokens in
  `prompt_tokens_details.cached_tokens`.
- `{base}` is `https://{region}-aiplatform.googleapis.com` (`https://aiplatform.googleapis.com`
  for the global region), or the connection's base URL.
- Auth: the service account's JSON key is the connection's encrypted secret. google-auth signs
  the token request; the token is cached per connection and refreshed before it expires, one
  refresh at a time. The token request goes out through the gateway's guarded transport, so the
  key's `token_uri` is held to the same destination rules as every upstream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from catalog.kinds import service_account_key
from gateway.providers.anthropic import beta_headers
from gateway.providers.base import Adapter, UpstreamRequest, register

if TYPE_CHECKING:
    from google.oauth2 import service_account

    from gateway.admission.routing import Target

VERTEX_VERSION = "vertex-2023-10-16"


class TokenUnavailable(httpx.ConnectError):
    """The service account's token could not be had: nothing was sent to Vertex (not billed)."""


class _Tokens:
    """One credentials object per (connection, key), refreshed under its own lock."""

    def __init__(self) -> None:
        self._creds: dict[tuple[int, str], service_account.Credentials] = {}
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}

    async def token(self, target: Target) -> str:
        secret = target.connection.plain_secret
        key = (target.connection.id, hashlib.sha256(secret.encode()).hexdigest())
        # google-auth is imported with the first token (gateway/providers/vertex_auth.py).
        from gateway.providers import vertex_auth

        creds = self._creds.get(key)
        if creds is None:
            try:
                info = service_account_key(secret)
            except ValueError as exc:
                raise TokenUnavailable(str(exc)) from None
            creds = self._creds[key] = vertex_auth.credentials(info)
        if creds.valid:  # google-auth counts a token within its refresh margin of expiry as invalid
            return str(creds.token)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not creds.valid:
                request = vertex_auth.LoopRequest(asyncio.get_running_loop())
                try:
                    await asyncio.to_thread(creds.refresh, request)
                except vertex_auth.GoogleAuthError as exc:
                    raise TokenUnavailable(f"the service account's token could not be refreshed: {exc}") from None
        return str(creds.token)


tokens = _Tokens()


class Vertex(Adapter):
    endpoints = frozenset({"messages", "chat"})
    max_tokens_param = "max_tokens"  # what Vertex's OpenAI-compatible endpoint documents

    def base(self, target: Target) -> str:
        if target.connection.base_url:
            return target.connection.base_url.rstrip("/").removesuffix("/v1")
        region = target.connection.options.get("region")
        return (
            "https://aiplatform.googleapis.com" if region == "global" else f"https://{region}-aiplatform.googleapis.com"
        )

    def location(self, target: Target) -> str:
        options = target.connection.options
        return f"{self.base(target)}/v1/projects/{options.get('project')}/locations/{options.get('region')}"

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        if endpoint == "messages":
            action = "streamRawPredict" if stream else "rawPredict"
            model = quote(self.model_id(target), safe="@")
            return f"{self.location(target)}/publishers/anthropic/models/{model}:{action}"
        return f"{self.location(target)}/endpoints/openapi/chat/completions"

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        if endpoint == "messages":
            return {k: v for k, v in body.items() if k != "model"} | {"anthropic_version": VERTEX_VERSION}
        model = self.model_id(target)
        return {**body, "model": model if "/" in model else f"google/{model}"}

    async def request(
        self, target: Target, endpoint: str, body: dict, client_headers: dict[str, str], *, stream: bool
    ) -> UpstreamRequest:
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if endpoint == "messages":  # betas as Anthropic's header; the version goes in the body
            headers |= {k: v for k, v in beta_headers(client_headers).items() if k != "anthropic-version"}
        if target.connection.options.get("forward_test_headers"):
            headers |= {k: v for k, v in client_headers.items() if k.startswith("x-upstream-")}
        headers["authorization"] = f"Bearer {await tokens.token(target)}"
        return UpstreamRequest(
            url=self.url(target, endpoint, stream=stream),
            content=json.dumps(self.body(target, endpoint, body, stream=stream)).encode(),
            headers=headers,
        )


register("vertex", Vertex())
