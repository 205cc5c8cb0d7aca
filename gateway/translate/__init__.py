"""Format translation: a request to /v1/chat/completions served by an Anthropic-format target,
and one to /v1/messages served by an OpenAI-format target (docs/billing.md, "Translation between
formats"; the per-field rules are gateway/billing/translation.py).

- `translate_request` turns the client's body into the target format's body and shapes it
  with that format's shaper, so the worst case is the translated body on each target
  (gateway/admission/sizing.py); a field without a faithful equivalent raises `Untranslatable` (400).
- `reply` / `error` reshape a target's answer and errors, `ChatFromMessages` /
  `MessagesFromChat` its stream. Usage is always read from the target's own format first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.admission.bounds import SHAPERS, Shape
from gateway.http.errors import bad_request
from gateway.translate.errors import Untranslatable
from gateway.translate.replies import error, reply
from gateway.translate.streaming import ChatFromMessages, MessagesFromChat
from gateway.translate.to_chat import to_chat
from gateway.translate.to_messages import to_messages

__all__ = [
    "ChatFromMessages",
    "MessagesFromChat",
    "Translated",
    "Untranslatable",
    "client_headers_for",
    "error",
    "reply",
    "stream_translator",
    "translate_request",
]


@dataclass(frozen=True)
class Translated:
    """A request in a target format: its body (the client's model and output ceiling; the
    proxy sets the target's) and that body's shape, which the bound is taken from."""

    kind: str  # the target format (gateway/admission/routing.py TRANSLATED)
    body: dict
    shape: Shape


# (client endpoint, target format) -> the translation of a body, given the client's headers.
TRANSLATORS: dict[tuple[str, str], Callable[[dict, dict[str, str]], dict]] = {
    ("chat", "messages"): lambda body, headers: to_messages(body),
    ("messages", "chat"): to_chat,
}


def translate_request(*, kind: str, body: dict, headers: dict[str, str], target: str | None = None) -> Translated:
    """The body of a `kind` request in the `target` format (by default the other of chat and
    messages), shaped. Raises Untranslatable."""
    target = target or ("messages" if kind == "chat" else "chat")
    try:
        out = TRANSLATORS[(kind, target)](body, headers)
    except (AttributeError, TypeError, KeyError) as exc:
        # The shaper checked the body's fields by type, not every nested part the translation
        # reads: a part of the wrong type is the client's malformed input, a 400 like any other.
        raise bad_request(f"The request has a malformed part the translation cannot read ({exc}).") from None
    # The target format's shaper checks the body as that endpoint would, and bounds it. Client
    # headers are the other format's: none of them is forwarded to this target.
    return Translated(kind=target, body=out, shape=SHAPERS[target](out, {}))


def stream_translator(*, client: str, upstream: str, wants_usage: bool) -> ChatFromMessages | MessagesFromChat:
    """The translator of a `upstream`-format target's stream for a `client` endpoint."""
    return ChatFromMessages(wants_usage=wants_usage) if client == "chat" else MessagesFromChat()


def client_headers_for(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers without its provider headers (anthropic-*, openai-*): they belong
    to the other format, and a target of this one must not be sent them."""
    return {k: v for k, v in headers.items() if not k.startswith(("anthropic-", "openai-"))}
