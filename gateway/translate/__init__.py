"""Format translation: a request to /v1/chat/completions (or a stateless one to /v1/responses)
served by an Anthropic-format target, one to /v1/messages served by an OpenAI-format target,
and either of the first two served by Gemini's native
generateContent or a Bedrock Converse target (docs/billing.md, "Translation between formats";
the per-field rules are
gateway/billing/translation.py).

- `translate_request` turns the client's body into the target format's body and shapes it
  with that format's shaper, so the worst case is the translated body on each target
  (gateway/admission/sizing.py); a field without a faithful equivalent raises `Untranslatable` (400).
- `reply` / `error` reshape a target's answer and errors, `stream_translator` its stream
  (gateway/translate/from_gemini.py for Gemini's). Usage is always read from the target's own
  format first.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission.bounds import SHAPERS, Shape
from gateway.http.errors import bad_request
from gateway.translate import from_converse, from_gemini, gemini, responses
from gateway.translate.converse import from_chat, from_messages, shape_converse
from gateway.translate.errors import Untranslatable
from gateway.translate.from_converse import ChatFromConverse, MessagesFromConverse
from gateway.translate.from_gemini import ChatFromGemini, MessagesFromGemini
from gateway.translate.replies import error as _error
from gateway.translate.replies import reply as _reply
from gateway.translate.responses import ResponsesFromMessages
from gateway.translate.streaming import ChatFromMessages, MessagesFromChat
from gateway.translate.to_chat import to_chat
from gateway.translate.to_messages import to_messages

__all__ = [
    "ChatFromConverse",
    "ChatFromGemini",
    "ChatFromMessages",
    "MessagesFromChat",
    "MessagesFromConverse",
    "MessagesFromGemini",
    "ResponsesFromMessages",
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

    kind: str  # the target format: chat | messages | converse | gemini
    body: dict
    shape: Shape


# The format a request of each endpoint is translated to when no target format is named.
_OTHER = {"chat": "messages", "messages": "chat", "responses": "messages"}


def translate_request(*, kind: str, body: dict, headers: dict[str, str], target: str | None = None) -> Translated:
    """The body of a `kind` request in the `target` format (the other of chat and messages
    unless named), shaped. Raises Untranslatable."""
    target = target or _OTHER[kind]
    try:
        if target == "converse":
            out = from_chat(body) if kind == "chat" else from_messages(body, headers)
            return Translated(kind=target, body=out, shape=shape_converse(out))
        if target == "gemini":
            out = gemini.from_chat(body) if kind == "chat" else gemini.from_messages(body, headers)
            return Translated(kind=target, body=out, shape=gemini.shape_generate_content(out))
        if kind == "responses":
            out, target = responses.to_messages_body(body), "messages"
        elif kind == "chat":
            out, target = to_messages(body), "messages"
        else:
            out, target = to_chat(body, headers), "chat"
    except (AttributeError, TypeError, KeyError) as exc:
        # The shaper checked the body's fields by type, not every nested part the translation
        # reads: a part of the wrong type is the client's malformed input, a 400 like any other.
        raise bad_request(f"The request has a malformed part the translation cannot read ({exc}).") from None
    # The target format's shaper checks the body as that endpoint would, and bounds it. Client
    # headers are the other format's: none of them is forwarded to this target.
    return Translated(kind=target, body=out, shape=SHAPERS[target](out, {}))


StreamTranslator = (
    ChatFromMessages
    | MessagesFromChat
    | ChatFromConverse
    | MessagesFromConverse
    | ChatFromGemini
    | MessagesFromGemini
    | ResponsesFromMessages
)


def stream_translator(
    *, client: str, wants_usage: bool, upstream: str | None = None, request: dict | None = None
) -> StreamTranslator:
    """The translator of a target's stream in the `upstream` format for a `client` endpoint
    (`request`: the client's body, which a Response echoes)."""
    if client == "responses":
        return ResponsesFromMessages(request=request or {})
    if upstream == "converse":
        return ChatFromConverse(wants_usage=wants_usage) if client == "chat" else MessagesFromConverse()
    if upstream == "gemini":
        return ChatFromGemini(wants_usage=wants_usage) if client == "chat" else MessagesFromGemini()
    return ChatFromMessages(wants_usage=wants_usage) if client == "chat" else MessagesFromChat()


def reply(data: bytes, *, upstream: str, client: str, model: str, request: dict | None = None) -> bytes:
    """A 200 body from a target speaking `upstream`, as the `client` endpoint answers
    (`request`: the client's body, which a Response echoes)."""
    if client == "responses":
        return responses.reply(data, model=model, request=request or {})
    if upstream == "converse":
        return from_converse.reply(data, client=client, model=model)
    if upstream == "gemini":
        return from_gemini.reply(data, client=client, model=model)
    return _reply(data, upstream=upstream, client=client, model=model)


def error(data: bytes, *, status: int, client: str, upstream: str | None = None) -> bytes:
    """A target's error body in the endpoint's own shape, its message kept."""
    if upstream == "converse":
        return from_converse.error(data, status=status, client=client)
    if upstream == "gemini":
        return from_gemini.error(data, status=status, client=client)
    return _error(data, status=status, client=client)


def client_headers_for(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers without its provider headers (anthropic-*, openai-*): they belong
    to the other format, and a target of this one must not be sent them."""
    return {k: v for k, v in headers.items() if not k.startswith(("anthropic-", "openai-"))}
