"""The Gemini API's OpenAI-compatible wire format in front of the fake's OpenAI handlers.

Gemini serves OpenAI's chat completions and embeddings under
`https://generativelanguage.googleapis.com/v1beta/openai/` (`chat/completions`, `embeddings`),
with a Gemini API key as `Authorization: Bearer`. Bodies and responses are OpenAI's. A thinking
model's thought tokens are billed as output but left out of `completion_tokens`: the usage
counts them in `total_tokens` only (the `thoughts_tokens` knob). Errors are Google's shape,
`{"error": {"code": <status>, "message": ..., "status": "<GRPC CODE>"}}`.
"""

from __future__ import annotations

from typing import Any

PREFIX = "/v1beta/openai/"
_V1 = {"chat/completions": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


def to_v1(path: str, headers: dict[str, str]) -> tuple[str, tuple[int, Any] | None]:
    """(the OpenAI path it serves, or the (status, error body) Gemini answers)."""
    v1_path = _V1.get(path[len(PREFIX) :])
    if v1_path is None:
        return "", (404, error(404, f"Method not found: {path}", "NOT_FOUND"))
    if not headers.get("authorization", "").startswith("Bearer ") or headers["authorization"] == "Bearer ":
        return "", (401, error(401, "Missing or invalid API key.", "UNAUTHENTICATED"))
    return v1_path, None


def error(status: int, message: str, grpc_status: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": grpc_status}}
