"""Google Vertex AI's wire formats in front of the fake's Anthropic and OpenAI handlers, and the
OAuth token endpoint a service account's key names (`token_uri`).

- `POST /token`: the JWT-bearer grant. The assertion is verified with the public key registered
  for its key id (`register_key`, what Google holds for a service account's key) and its audience
  must be Google's token URI (google-auth signs for it whatever `token_uri` says); the answer is
  an access token valid for an hour.
- `POST /v1/projects/{p}/locations/{r}/publishers/anthropic/models/{model}:rawPredict` (and
  `:streamRawPredict`, answered with Anthropic's SSE): Anthropic's Messages body without `model`,
  with `anthropic_version`.
- `POST /v1/projects/{p}/locations/{r}/endpoints/openapi/chat/completions`: OpenAI's chat body,
  the model named `google/{model}`; usage as OpenAI's (thinking tokens in the total only, cached
  tokens in prompt_tokens_details).
- Every Vertex call needs `Authorization: Bearer <a token this fake issued>`; errors are Google's
  `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

from google.auth import jwt

TOKEN_PATH = "/token"
PREFIX = "/v1/projects/"
_CLAUDE = re.compile(
    r"/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/publishers/anthropic/models/"
    r"(?P<model>[^/:]+):(?P<action>rawPredict|streamRawPredict)"
)
_OPENAPI = re.compile(r"/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/endpoints/openapi/chat/completions")
GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
AUDIENCE = "https://oauth2.googleapis.com/token"

_PUBLIC_KEYS: dict[str, str] = {}  # private_key_id (the JWT kid) -> public key (PEM)


def register_key(key_id: str, public_pem: str) -> None:
    _PUBLIC_KEYS[key_id] = public_pem


class Tokens:
    """The access tokens this fake issued (one store per fake server)."""

    def __init__(self) -> None:
        self.issued: dict[str, float] = {}  # token -> expiry (epoch seconds)
        self.grants = 0

    def grant(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        form = {k: v[-1] for k, v in parse_qs(raw.decode("latin-1")).items()}
        if form.get("grant_type") != GRANT or "assertion" not in form:
            return 400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type."}
        try:
            claims = jwt.decode(form["assertion"], certs=_PUBLIC_KEYS, audience=AUDIENCE)  # by the key id (kid)
        except ValueError as exc:
            return 400, {"error": "invalid_grant", "error_description": f"Invalid JWT Signature. ({exc})"}
        if "cloud-platform" not in str(claims.get("scope", "")):
            return 400, {"error": "invalid_scope", "error_description": "Invalid OAuth scope."}
        self.grants += 1
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self.issued[token] = time.time() + 3600
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    def valid(self, headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme == "Bearer" and self.issued.get(token, 0) > time.time()


def to_v1(path: str, headers: dict[str, str], body: Any, tokens: Tokens) -> tuple[str, Any, tuple[int, Any] | None]:
    """(the v1 path it serves, the body it serves it with, or the (status, error) Vertex answers)."""
    claude, openapi = _CLAUDE.fullmatch(path), _OPENAPI.fullmatch(path)
    if claude is None and openapi is None:
        return "", None, (404, error(404, f"The requested URL {path} was not found.", "NOT_FOUND"))
    if not tokens.valid(headers):
        message = "Request had invalid authentication credentials. Expected OAuth 2 access token."
        return "", None, (401, error(401, message, "UNAUTHENTICATED"))
    if not isinstance(body, dict):
        return "", None, (400, error(400, "Invalid JSON payload received.", "INVALID_ARGUMENT"))
    if claude is not None:
        if "model" in body or not body.get("anthropic_version"):
            message = "anthropic_version: required; model: not allowed (the path names the model)"
            return "", None, (400, error(400, message, "INVALID_ARGUMENT"))
        stream = claude["action"] == "streamRawPredict"
        return "/v1/messages", {**body, "model": claude["model"], "stream": stream}, None
    if not str(body.get("model", "")).startswith("google/"):
        return "", None, (400, error(400, "Model must be named publishers' style: google/<model>.", "INVALID_ARGUMENT"))
    return "/v1/chat/completions", body, None


def error(status: int, message: str, grpc_status: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": grpc_status}}


def new_service_account(token_uri: str, *, project: str = "capgate-test") -> dict[str, Any]:
    """A service account's JSON key whose token requests this fake accepts: a fresh RSA key, its
    public half registered as Google would hold it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_id = secrets.token_hex(20)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    register_key(key_id, public_pem)
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": key_id,
        "private_key": private_pem,
        "client_email": f"capgate@{project}.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_uri,
    }
