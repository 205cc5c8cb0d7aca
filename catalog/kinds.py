"""What each connection kind needs in its options and secret, checked when a connection is saved
(API, apply, dashboard: all through catalog/services.py). Each value checked here goes into an
upstream URL, header or signature, so only its documented shape is accepted; the gateway's
adapters (gateway/providers/) read them as checked.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

from catalog.presets import PRESETS
from core.errors import InvalidChange

_AZURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_AZURE_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?")
_CLOUD_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}")
_AWS_KEY_FIELDS = {"access_key_id", "secret_access_key", "session_token"}
VERTEX_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def _refuse(message: str) -> InvalidChange:
    return InvalidChange(message, param="options")


def check_azure_options(options: dict[str, Any]) -> None:
    """An Azure OpenAI connection's api-version, auth and deployment names."""
    version = options.get("api_version")
    if version is not None and not (isinstance(version, str) and _AZURE_VERSION.fullmatch(version)):
        raise _refuse('options.api_version: an Azure api-version such as "2024-10-21".')
    if options.get("auth") not in (None, "api_key", "entra"):
        raise _refuse('options.auth: "api_key" (an api-key header) or "entra" (a bearer token).')
    deployments = options.get("deployments")
    if deployments is not None and not (
        isinstance(deployments, dict)
        and all(isinstance(k, str) and isinstance(v, str) and _AZURE_NAME.fullmatch(v) for k, v in deployments.items())
    ):
        raise _refuse("options.deployments: an object of model name to deployment name (letters, digits, . _ -).")


def check_model_ids(options: dict[str, Any]) -> None:
    """options.model_ids (any kind): catalog model name -> the provider's own id for it."""
    ids = options.get("model_ids")
    if ids is not None and not (
        isinstance(ids, dict)
        and all(isinstance(k, str) and isinstance(v, str) and _MODEL_ID.fullmatch(v) for k, v in ids.items())
        and not any(".." in v for v in ids.values())
    ):
        raise _refuse("options.model_ids: an object of catalog model name to the provider's model id.")


def aws_keys(secret: str) -> dict[str, str] | None:
    """A Bedrock connection's keys from its secret; None for an empty secret (the gateway's own
    credential chain). Raises ValueError."""
    if not secret:
        return None
    try:
        keys = json.loads(secret)
    except ValueError:
        keys = None
    if (
        not isinstance(keys, dict)
        or not set(keys) <= _AWS_KEY_FIELDS
        or not all(isinstance(keys.get(k), str) and keys[k] for k in ("access_key_id", "secret_access_key"))
        or not isinstance(keys.get("session_token", ""), str)
    ):
        raise ValueError(
            "the secret: a JSON object with access_key_id, secret_access_key and an optional session_token."
        )
    return keys


def check_bedrock(options: dict[str, Any], secret: str | None) -> None:
    region = options.get("region")
    if not (isinstance(region, str) and _CLOUD_NAME.fullmatch(region)):
        raise _refuse('options.region: the AWS region of the Bedrock endpoint, such as "us-east-1".')
    if options.get("api") not in (None, "invoke", "converse"):
        raise _refuse(
            'options.api: "invoke" (Claude\'s Messages body on InvokeModel) or "converse" (the Converse API).'
        )
    profile = options.get("profile")
    if profile is not None and not (isinstance(profile, str) and profile.isprintable() and 0 < len(profile) <= 64):
        raise _refuse("options.profile: the name of an AWS profile.")
    if secret is None:  # an edit keeping the stored secret
        return
    try:
        keys = aws_keys(secret)
    except ValueError as exc:
        raise InvalidChange(str(exc), param="secret") from None
    if keys is None and not settings.CAPGATE["BEDROCK_AMBIENT_CREDENTIALS"]:
        raise InvalidChange(
            "the secret: this deployment does not lend its own AWS credentials to connections; "
            "give access_key_id and secret_access_key.",
            param="secret",
        )


def service_account_key(secret: str) -> dict[str, Any]:
    """A service account's JSON key, checked by google-auth itself. Raises ValueError."""
    try:
        info = json.loads(secret)
    except ValueError:
        info = None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ValueError('the secret: a service account\'s JSON key ("type": "service_account").')
    from google.oauth2 import service_account  # here: a gateway worker checks no key at startup

    try:
        service_account.Credentials.from_service_account_info(info, scopes=VERTEX_SCOPES)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"the secret: not a usable service account key ({exc}).") from None
    return info


def check_vertex(options: dict[str, Any], secret: str | None) -> None:
    for name, example in (("project", "my-project"), ("region", "us-east5")):
        value = options.get(name)
        if not (isinstance(value, str) and _CLOUD_NAME.fullmatch(value)):
            raise _refuse(
                f'options.{name}: the Google Cloud {name} (lowercase letters, digits, -), such as "{example}".'
            )
    if secret is None:
        return
    try:
        service_account_key(secret)
    except ValueError as exc:
        raise InvalidChange(str(exc), param="secret") from None


def check_gemini(options: dict[str, Any], secret: str | None) -> None:
    """Which of the Gemini API's interfaces the connection speaks (gateway/providers/gemini.py)."""
    if options.get("api") not in (None, "openai", "native"):
        raise _refuse(
            'options.api: "openai" (the OpenAI-compatible endpoint, the default) or "native" (generateContent).'
        )


def _preset_check(kind: str) -> Any:
    def check(options: dict[str, Any], secret: str | None) -> None:
        for _header, option in PRESETS[kind].headers:
            value = options.get(option)
            if value is not None and not (isinstance(value, str) and value.isprintable() and len(value) <= 200):
                raise _refuse(f"options.{option}: a printable string of at most 200 characters (sent as a header).")

    return check


# Each kind's own check of its options and secret (a kind not listed needs none of its own).
CHECKS = {
    "bedrock": check_bedrock,
    "vertex": check_vertex,
    "gemini": check_gemini,
    **{kind: _preset_check(kind) for kind in PRESETS},
}


def check_kind(*, kind: str, options: dict[str, Any], secret: str | None) -> None:
    """Raise InvalidChange naming what a connection of `kind` lacks or has wrong. `secret` is
    None on an edit that keeps the stored one."""
    check_azure_options(options)  # any kind: these options reach URLs if the kind is changed later
    check_model_ids(options)
    check = CHECKS.get(kind)
    if check is not None:
        check(options, secret)
