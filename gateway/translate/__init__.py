"""Format translation: a request to /v1/chat/completions served by an Anthropic-format target,
one to /v1/messages served by an OpenAI-format target, and either served by Gemini's native
generateContent (docs/billing.md, "Translation between formats"; the per-field rules are
gateway/billing/translation.py).

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
from gateway.translate import gemini
from gateway.translate.errors import Untranslatable
from gateway.translate.replies import error, reply
from gateway.translate.streaming import ChatFromMessages, MessagesFromChat, MessagesFromGemini
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


def _messages_to_gemini(body: dict, headers: dict[str, str]) -> dict:
    """A messages body to generateContent through the chat translation: a field either table
    refuses is refused, named as the client sent it. The fields Gemini has and chat lacks
    (gemini.FROM_MESSAGES: top_k, a thinking budget) are carried directly."""
    rest, direct = gemini.split_messages_fields(body)
    try:
        chat = to_chat(rest, headers)
    except Untranslatable as exc:
        raise Untranslatable(exc.field, exc.why, target="gemini") from None
    out = gemini.to_gemini(chat)
    if direct:
        out["generationConfig"] = {**(out.get("generationConfig") or {}), **direct}
    return out


# (client endpoint, target format) -> the translation of a body, given the client's headers.
TRANSLATORS: dict[tuple[str, str], Callable[[dict, dict[str, str]], dict]] = {
    ("chat", "messages"): lambda body, headers: to_messages(body),
    ("messages", "chat"): to_chat,
    ("chat", "gemini"): lambda body, headers: gemini.to_gemini(body),
    ("messages", "gemini"): _messages_to_gemini,
}
# Each target format's shaper: what the bound of a translated body is taken from.
TARGET_SHAPERS = {**SHAPERS, "gemini": gemini.shape_generate_content}


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
    return Translated(kind=target, body=out, shape=TARGET_SHAPERS[target](out, {}))


StreamTranslator = ChatFromMessages | MessagesFromChat | gemini.ChatFromGemini | MessagesFromGemini


def stream_translator(*, client: str, upstream: str, wants_usage: bool) -> StreamTranslator:
    """The translator of a `upstream`-format target's stream for a `client` endpoint."""
    if upstream == "gemini":
        return gemini.ChatFromGemini(wants_usage=wants_usage) if client == "chat" else MessagesFromGemini()
    return ChatFromMessages(wants_usage=wants_usage) if client == "chat" else MessagesFromChat()


def client_headers_for(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers without its provider headers (anthropic-*, openai-*): they belong
    to the other format, and a target of this one must not be sent them."""
    return {k: v for k, v in headers.items() if not k.startswith(("anthropic-", "openai-"))}
