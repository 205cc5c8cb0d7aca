"""Gemini's native generateContent format as a translation target (docs/billing.md, "Translation
between formats"; the per-field rules are gateway/billing/translation.py `CHAT_TO_GEMINI`).

- `to_gemini`: an OpenAI chat completions body as a generateContent body. The gateway's own
  fields stay at the top level (`model`, `stream`, and an injected `maxOutputTokens`); the
  adapter (gateway/providers/gemini_native.py) moves them to the URL and `generationConfig`.
  A /v1/messages body reaches it through the chat translation (`from_messages`, by
  gateway/translate/to_chat.py), with the fields chat has no place for carried directly.
- `shape_generate_content`: that body's bound, taken from its own bytes.
The answer, its stream and its errors come back through gateway/translate/from_gemini.py.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from gateway.admission.bounds import MAX_CHOICES, Shape
from gateway.admission.request_fields import text_tokens
from gateway.billing.translation import CHAT_TO_GEMINI, FIELDS, REFUSED
from gateway.http.errors import bad_request
from gateway.translate.errors import Untranslatable, chat_functions
from gateway.translate.to_chat import to_chat

_RULES = FIELDS[CHAT_TO_GEMINI]
_TARGET = "gemini"
# Fields whose zero or false value is the default, so only another value needs an equivalent.
_DEFAULTS: dict[str, Any] = {"logprobs": False, "n": 1}
# Gemini 3 checks that a replayed function call carries the thought signature it was answered
# with; a conversation carried in another format has none, and this is the value Google
# documents for a call whose signature was not kept.
SKIP_SIGNATURE = "skip_thought_signature_validator"
_EFFORTS = {"minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH", "xhigh": "XHIGH"}


def _refuse(field: str, why: str | None = None) -> Untranslatable:
    return Untranslatable(field, why or _RULES.get(field, _RULES["messages"]).why, target=_TARGET)


# --- the request --------------------------------------------------------------------------


def _image(part: dict, where: str) -> dict:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url.startswith("data:"):
        raise _refuse(where, "Gemini takes images inline; an image URL has no faithful equivalent")
    head, sep, data = url.partition(",")
    media = head[len("data:") :].removesuffix(";base64")
    if not sep or not head.endswith(";base64") or not media.startswith("image/"):
        raise _refuse(where, "an image data URL must be base64 of an image/* type")
    return {"inlineData": {"mimeType": media, "data": data}}


def _parts(content: Any, where: str) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    out: list[dict] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"text": part["refusal"]})
        elif kind == "image_url":
            out.append(_image(part, at))
        else:
            raise _refuse(at, f"content parts of type '{kind}' have no equivalent")
    return out


def _text(content: Any, where: str, what: str = "system messages") -> str:
    parts = _parts(content, where)
    if any("text" not in p for p in parts):
        raise _refuse(where, f"{what} may hold text only")
    return "\n\n".join(p["text"] for p in parts)


def _function_call(call: Any, where: str) -> tuple[str, dict]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise _refuse(where, "only function tool calls have an equivalent")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        raise _refuse(where, "tool-call arguments must be a JSON object")
    name = str(function.get("name") or "")
    return str(call.get("id") or ""), {"functionCall": {"name": name, "args": arguments}}


def _contents(messages: list) -> tuple[str | None, list[dict]]:
    system: list[str] = []
    out: list[dict] = []
    names: dict[str, str] = {}  # tool call id -> function name (a function response names it)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if m.get("name") is not None:
            raise _refuse(f"{where}.name", "participant names have no equivalent")
        if role in ("system", "developer"):
            # Gemini has one system instruction: a system message between turns (Claude Code
            # sends them) joins it, in order, rather than becoming words of another role.
            system.append(_text(m.get("content"), where))
            continue
        if role == "user":
            turn = ("user", _parts(m.get("content"), where))
        elif role == "assistant":
            if m.get("audio") is not None or m.get("function_call") is not None:
                raise _refuse(where, "assistant audio and legacy function calls have no equivalent")
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _refuse(f"{where}.tool_calls", "tool_calls must be an array")
            parts = _parts(m.get("content"), where)
            for k, c in enumerate(calls):
                call_id, part = _function_call(c, f"{where}.tool_calls[{k}]")
                names[call_id] = part["functionCall"]["name"]
                if k == 0:
                    part["thoughtSignature"] = SKIP_SIGNATURE
                parts.append(part)
            turn = ("model", parts)
        elif role == "tool":
            call_id = str(m.get("tool_call_id") or "")
            if call_id not in names:
                raise _refuse(f"{where}.tool_call_id", "a tool result must answer a tool call earlier in the messages")
            result = _text(m.get("content"), where, "tool results")
            turn = ("user", [{"functionResponse": {"name": names[call_id], "response": {"result": result}}}])
        else:
            raise _refuse(f"{where}.role", f"messages of role '{role}' have no equivalent")
        if not turn[1]:  # an empty turn says nothing, and Gemini refuses a content without parts
            continue
        if out and out[-1]["role"] == turn[0]:  # consecutive turns of one role merge
            out[-1]["parts"].extend(turn[1])
        else:
            out.append({"role": turn[0], "parts": turn[1]})
    for merged in out:  # function responses first in a user turn, as Gemini answers calls
        merged["parts"].sort(key=lambda p: "functionResponse" not in p)
    return ("\n\n".join(system) if system else None), out


def _tools(tools: Any) -> list[dict]:
    declarations = []
    for function in chat_functions(tools, _refuse):
        declaration: dict = {"name": function.get("name")}
        if function.get("description") is not None:
            declaration["description"] = function["description"]
        if function.get("parameters") is not None:
            declaration["parametersJsonSchema"] = function["parameters"]
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}] if declarations else []


def _tool_config(choice: Any) -> dict | None:
    if choice is None:
        return None
    if choice == "auto":
        config: dict = {"mode": "AUTO"}
    elif choice == "none":
        config = {"mode": "NONE"}
    elif choice == "required":
        config = {"mode": "ANY"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = str((choice.get("function") or {}).get("name") or "")
        config = {"mode": "ANY", "allowedFunctionNames": [name]}
    else:
        raise _refuse("tool_choice", "only auto, none, required and a named function have an equivalent")
    return {"functionCallingConfig": config}


def _response_format(fmt: Any) -> dict:
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    schema = fmt.get("json_schema") if kind == "json_schema" else None
    if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
        return {"responseMimeType": "application/json", "responseJsonSchema": schema["schema"]}
    raise _refuse("response_format")


def _thinking(effort: Any) -> dict:
    if effort is None:
        return {}
    if effort == "none":
        return {"thinkingConfig": {"thinkingBudget": 0}}
    if effort in _EFFORTS:
        return {"thinkingConfig": {"thinkingLevel": _EFFORTS[effort]}}
    raise _refuse("reasoning_effort")


def from_chat(body: dict) -> dict:
    """The generateContent body for a chat completions `body` (`model`, `stream` and the
    output ceiling as the client sent them; the proxy sets the target's). Raises Untranslatable."""
    for name, value in body.items():
        rule = _RULES.get(name)
        if rule is None:
            raise _refuse(name, "the translation table does not know this field")
        if value is None or (name in _DEFAULTS and value == _DEFAULTS[name]):
            continue
        if rule.how == REFUSED:
            raise _refuse(name)
    system, contents = _contents(body["messages"])
    if not contents:
        raise _refuse("messages", "Gemini needs at least one user or assistant turn besides the system prompt")
    out: dict = {"model": body["model"], "contents": contents}
    if system is not None:
        out["systemInstruction"] = {"parts": [{"text": system}]}
    config: dict = {}
    ceiling = body.get("max_completion_tokens") or body.get("max_tokens")
    if ceiling is not None:
        config["maxOutputTokens"] = ceiling
    stop = body.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    for name, key in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if body.get(name) is not None:
            config[key] = body[name]
    if body.get("n") not in (None, 1):
        config["candidateCount"] = body["n"]
    config |= _response_format(body.get("response_format"))
    config |= _thinking(body.get("reasoning_effort"))
    if config:
        out["generationConfig"] = config
    if body.get("stream"):
        out["stream"] = True
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    if body.get("parallel_tool_calls") is False and tools:
        raise _refuse("parallel_tool_calls")
    tool_config = _tool_config(body.get("tool_choice"))
    if tool_config is not None and (tools or tool_config["functionCallingConfig"]["mode"] == "NONE"):
        out["toolConfig"] = tool_config
    tier = body.get("service_tier")
    if tier not in (None, "auto", "default"):
        raise _refuse("service_tier")
    if any(m != "text" for m in body.get("modalities") or []):
        raise _refuse("modalities")
    return out


def split_messages_fields(body: dict) -> tuple[dict, dict]:
    """A messages body without the fields Gemini takes directly, and their generationConfig:
    `top_k` as `topK`, thinking enabled with `budget_tokens` as `thinkingConfig.thinkingBudget`
    (inside maxOutputTokens on Gemini as inside max_tokens on Anthropic). Adaptive and disabled
    thinking go through the chat translation (as reasoning_effort)."""
    rest = dict(body)
    config: dict[str, Any] = {}
    top_k = rest.pop("top_k", None)
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise _refuse("top_k", "top_k must be a positive integer")
        config["topK"] = top_k
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise _refuse("thinking", "enabled thinking needs a positive budget_tokens")
        del rest["thinking"]
        config["thinkingConfig"] = {"thinkingBudget": budget}
    return rest, config


def from_messages(body: dict, headers: dict[str, str]) -> dict:
    """A messages body to generateContent through the chat translation: a field either table
    refuses is refused, named as the client sent it. The fields Gemini has and chat lacks
    (`split_messages_fields`: top_k, a thinking budget) are carried directly."""
    rest, direct = split_messages_fields(body)
    try:
        chat = to_chat(rest, headers)
    except Untranslatable as exc:
        raise Untranslatable(exc.field, exc.why, target=_TARGET) from None
    out = from_chat(chat)
    if direct:
        out["generationConfig"] = {**(out.get("generationConfig") or {}), **direct}
    return out


def shape_generate_content(body: dict, headers: dict[str, str] | None = None) -> Shape:
    """The bound of a generateContent body made by `to_gemini`: its UTF-8 bytes (inline images
    blanked, each bounded by the model's image maximum instead) plus framing per turn."""
    images = unbounded = 0

    def strip(part: Any) -> Any:
        nonlocal images, unbounded
        if isinstance(part, dict) and isinstance(part.get("inlineData"), dict):
            mime = str(part["inlineData"].get("mimeType") or "")
            if mime.startswith("image/"):
                images += 1
            else:
                unbounded += 1
            return {"inlineData": {"mimeType": mime}}
        return part

    contents = body.get("contents") or []
    billed = {**body, "contents": [{**c, "parts": [strip(p) for p in c.get("parts") or []]} for c in contents]}
    config = body.get("generationConfig") or {}
    ceiling = config.get("maxOutputTokens")
    choices = config.get("candidateCount") or 1
    if not isinstance(choices, int) or not 1 <= choices <= MAX_CHOICES:
        raise bad_request(f"'n' must be an integer between 1 and {MAX_CHOICES}.", param="n")
    overhead = settings.CAPGATE["TOOL_USE_OVERHEAD_TOKENS"] if body.get("tools") else 0
    return Shape(
        kind="gemini",
        model=str(body.get("model") or ""),
        text_tokens=text_tokens(billed, contents) + overhead,
        images=images,
        unbounded_parts=unbounded,
        max_output=ceiling if isinstance(ceiling, int) else None,
        output_param="maxOutputTokens" if isinstance(ceiling, int) else None,
        choices=choices,
        stream=bool(body.get("stream")),
    )
