"""An OpenAI chat completions request as an Anthropic messages request (docs/billing.md,
"Translation between formats"; the rules are gateway/billing/translation.py)."""

from __future__ import annotations

import json
from typing import Any

from gateway.billing.translation import CHAT_TO_MESSAGES, FIELDS, REFUSED
from gateway.translate.errors import Untranslatable, chat_functions

_RULES = FIELDS[CHAT_TO_MESSAGES]
_TARGET = "messages"
# Fields whose zero or false value is the default, so only another value needs an equivalent.
_DEFAULTS: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "n": 1}


def _refuse(field: str, why: str | None = None) -> Untranslatable:
    return Untranslatable(field, why or _RULES.get(field, _RULES["messages"]).why, target=_TARGET)


def _image(part: dict, where: str) -> dict:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise _refuse(where, "an image part needs a url")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        media = head[len("data:") :].removesuffix(";base64")
        if not sep or not head.endswith(";base64") or not media.startswith("image/"):
            raise _refuse(where, "an image data URL must be base64 of an image/* type")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any, where: str) -> list[dict]:
    """User or assistant content as Anthropic content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"type": "text", "text": part["refusal"]})
        elif kind == "image_url":
            out.append(_image(part, at))
        else:
            raise _refuse(at, f"content parts of type '{kind}' have no equivalent")
    return out


def _tool_use(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise _refuse(where, "only function tool calls have an equivalent")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        raise _refuse(where, "tool-call arguments must be a JSON object")
    return {
        "type": "tool_use",
        "id": str(call.get("id") or ""),
        "name": str(function.get("name") or ""),
        "input": arguments,
    }


def _text(content: Any, where: str) -> str:
    blocks = _blocks(content, where)
    if any(b["type"] != "text" for b in blocks):
        raise _refuse(where, "system messages may hold text only")
    return "\n\n".join(b["text"] for b in blocks)


def _messages(messages: list) -> tuple[str | None, list[dict]]:
    system: list[str] = []
    out: list[dict] = []
    turn: tuple[str, list[dict]]
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if m.get("name") is not None:
            raise _refuse(f"{where}.name", "participant names have no equivalent")
        if role in ("system", "developer"):
            if out:
                raise _refuse(f"{where}.role", "a system message after the conversation started has no equivalent")
            system.append(_text(m.get("content"), where))
            continue
        if role == "user":
            turn = ("user", _blocks(m.get("content"), where))
        elif role == "assistant":
            if m.get("audio") is not None or m.get("function_call") is not None:
                raise _refuse(where, "assistant audio and legacy function calls have no equivalent")
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _refuse(f"{where}.tool_calls", "tool_calls must be an array")
            uses = [_tool_use(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
            turn = ("assistant", _blocks(m.get("content"), where) + uses)
        elif role == "tool":
            content = m.get("content")
            result: Any = content if isinstance(content, str) else _blocks(content, where)
            block = {"type": "tool_result", "tool_use_id": str(m.get("tool_call_id") or ""), "content": result}
            turn = ("user", [block])
        else:
            raise _refuse(f"{where}.role", f"messages of role '{role}' have no equivalent")
        if out and out[-1]["role"] == turn[0]:  # Anthropic turns alternate: consecutive ones merge
            out[-1]["content"].extend(turn[1])
        else:
            out.append({"role": turn[0], "content": turn[1]})
    for merged in out:  # results first: Anthropic wants them at the start of the user turn
        merged["content"].sort(key=lambda b: b.get("type") != "tool_result")
    return ("\n\n".join(system) if system else None), out


def _tools(tools: Any) -> list[dict]:
    out = []
    for function in chat_functions(tools, _refuse):
        converted = {"name": function.get("name"), "input_schema": function.get("parameters") or {"type": "object"}}
        if function.get("description") is not None:
            converted["description"] = function["description"]
        out.append(converted)
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict | None:
    if choice is None and parallel in (None, True):
        return None
    if choice in (None, "auto"):
        out: dict = {"type": "auto"}
    elif choice == "none":
        out = {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        out = {"type": "tool", "name": str((choice.get("function") or {}).get("name") or "")}
    else:
        raise _refuse("tool_choice", "only auto, none, required and a named function have an equivalent")
    if parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def to_messages(body: dict) -> dict:
    """The Anthropic messages body for a chat completions `body` (model and output ceiling as
    the client sent them; the proxy sets the target's). Raises Untranslatable."""
    for name, value in body.items():
        rule = _RULES.get(name)
        if rule is None:
            raise _refuse(name, "the translation table does not know this field")
        if value is None or (name in _DEFAULTS and value == _DEFAULTS[name]):
            continue
        if rule.how == REFUSED or name == "n":
            raise _refuse(name)
    system, messages = _messages(body["messages"])
    out: dict = {"model": body["model"], "messages": messages}
    if system is not None:
        out["system"] = system
    ceiling = body.get("max_completion_tokens") or body.get("max_tokens")
    if ceiling is not None:
        out["max_tokens"] = ceiling
    stop = body.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, int | float) or temperature > 1:
            raise _refuse("temperature")
        out["temperature"] = temperature
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    if body.get("stream"):
        out["stream"] = True
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None and (out.get("tools") or choice["type"] == "none"):
        out["tool_choice"] = choice
    user = body.get("safety_identifier") or body.get("user")
    if user is not None:
        out["metadata"] = {"user_id": user}
    tier = body.get("service_tier")
    if tier == "default":
        out["service_tier"] = "standard_only"
    elif tier not in (None, "auto"):
        raise _refuse("service_tier")
    if any(m != "text" for m in body.get("modalities") or []):
        raise _refuse("modalities")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _refuse("response_format")
    return out
