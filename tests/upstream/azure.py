"""Azure OpenAI's wire format in front of the fake's OpenAI handlers.

Azure serves each model under a deployment, `/openai/deployments/{deployment}/chat/completions`
(and `/embeddings`), requires an `api-version` query parameter, and takes either a resource key in
`api-key` or a Microsoft Entra ID token as `Authorization: Bearer`. The body and the response
are OpenAI's (the body's `model` is ignored: the deployment decides). Errors are Azure's own
shape, `{"error": {"code": "<status>", "message": ...}}`.
"""

from __future__ import annotations

import re
from typing import Any

PREFIX = "/openai/deployments/"
_PATH = re.compile(r"/openai/deployments/(?P<deployment>[^/]+)/(?P<endpoint>chat/completions|embeddings)")
_V1 = {"chat/completions": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


def to_v1(path: str, query: dict[str, str], headers: dict[str, str]) -> tuple[str, str, tuple[int, Any] | None]:
    """(the OpenAI path it serves, the deployment, or the (status, error body) Azure answers)."""
    match = _PATH.fullmatch(path)
    if match is None:
        return "", "", (404, _error(404, "Resource not found"))
    if not (headers.get("api-key") or headers.get("authorization", "").startswith("Bearer ")):
        return "", "", (401, _error(401, "Access denied due to invalid subscription key or wrong API endpoint."))
    if not query.get("api-version"):
        return "", "", (404, _error(404, "Resource not found"))
    return _V1[match["endpoint"]], match["deployment"], None


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": str(status), "message": message}}
