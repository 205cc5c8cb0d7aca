"""An Anthropic messages request as an OpenAI chat completions request (docs/billing.md,
"Translation between formats"; the rules are gateway/billing/translation.py)."""

from __future__ import annotations

import json
from typing import Any

from gateway.billing import undated
from gateway.billing.translation import DROPPED_BETAS, FIELDS, MESSAGES_TO_CHAT, REFUSED
from gateway.translate.errors import Untranslatable

_RULES = FIELDS[MESSAGES_TO_CHAT]
_TARGET = "chat"
MAX_STOP = 4  # OpenAI's limit on stop sequences


def _refuse(field: str, why: str | None = None) -> Untranslatable:
    return Untranslatable(field, why or _RULES.get(field, _RULES["messages"]).why, target=_TARGET)


def _image(block: dict, where: str) -> dict:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _refuse(where, "an image block needs a source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _refuse(where, f"image sources of type '{source.get('type')}' have no equivalent")
    return {"type": "image_url", "image_url": {"url": url}}


def _text_of(content: Any, where: str) -> str:
    """Text-only content (a system prompt, a tool result) as one string."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content or []):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise _refuse(f"{where}[{j}]", f"blocks of type '{kind}' have no equivalent here")
        texts.append(str(block.get("text", "")))
    return "\n\n".join(texts)


def _parts(blocks: list, where: str) -> str | list:
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        return blocks[0]["text"]
    return blocks


def _user(content: Any, where: str) -> list[dict]:
    """One user turn: its tool results as `tool` messages, then the rest as a user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict] = []
    parts: list[dict] = []
    for j, block in enumerate(content or []):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            text = _text_of(block.get("content"), f"{at}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
        else:
            raise _refuse(at, f"blocks of type '{kind}' have no equivalent")
    return results + ([{"role": "user", "content": _parts(parts, where)}] if parts else [])


def _assistant(content: Any, where: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(content or []):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": str(block.get("name") or ""), "arguments": arguments}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": function})
        else:
            raise _refuse(at, f"blocks of type '{kind}' have no equivalent")
    out: dict = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _messages(system: Any, messages: list) -> list[dict]:
    out: list[dict] = []
    if system:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.get("role") == "user":
            out += _user(m.get("content"), where)
        elif m.get("role") == "assistant":
            out.append(_assistant(m.get("content"), where))
        elif m.get("role") == "system":  # a system message between turns, kept at its place
            out.append({"role": "system", "content": _text_of(m.get("content"), f"{where}.content")})
        else:
            raise _refuse(f"{where}.role", f"messages of role '{m.get('role')}' have no equivalent")
    return out


# A custom tool's settings that have an equivalent (cache_control is dropped: see the table).
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control"}


def _tools(tools: list) -> list[dict]:
    out = []
    for i, tool in enumerate(tools):
        kind = undated(str(tool.get("type") or "custom"))
        if kind != "custom":
            raise _refuse(f"tools[{i}].type", f"Anthropic's '{kind}' tool has no equivalent")
        for key in sorted(set(tool) - _TOOL_KEYS):
            if tool[key] not in (None, False):
                raise _refuse(f"tools[{i}].{key}", "this tool setting has no equivalent")
        function: dict = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict) -> tuple[Any, bool]:
    kind = choice.get("type")
    mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": str(choice.get("name") or "")}}
    if mapped is None:
        raise _refuse("tool_choice", f"tool choice '{kind}' has no equivalent")
    return mapped, bool(choice.get("disable_parallel_tool_use"))


_EFFORTS = {"low", "medium", "high"}


def _effort(thinking: Any, config: Any) -> str | None:
    """The reasoning effort of adaptive thinking (output_config's effort, Anthropic's default
    high when absent); None without thinking or effort."""
    config = config if isinstance(config, dict) else {}
    if config.get("format") is not None:
        raise _refuse("output_config.format", "structured output formats have no equivalent here")
    effort = config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise _refuse("output_config.effort", f"effort '{effort}' has no equivalent")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in (None, "disabled", "adaptive"):
        raise _refuse("thinking", "a thinking token budget has no equivalent; adaptive thinking maps")
    if kind == "adaptive":
        return effort or "high"
    return effort


def check_betas(headers: dict[str, str]) -> None:
    """anthropic-beta values only an Anthropic target could act on are refused."""
    for value in (headers.get("anthropic-beta") or "").split(","):
        beta = undated(value.strip())
        if beta and beta not in DROPPED_BETAS:
            raise _refuse(f"anthropic-beta: {beta}", "this beta changes what an Anthropic model does")


def to_chat(body: dict, headers: dict[str, str] | None = None) -> dict:
    """The chat completions body for a messages `body`. Raises Untranslatable."""
    check_betas(headers or {})
    for name, value in body.items():
        rule = _RULES.get(name)
        if rule is None:
            raise _refuse(name, "the translation table does not know this field")
        if value is not None and rule.how == REFUSED:
            raise _refuse(name)
    out: dict = {"model": body["model"], "messages": _messages(body.get("system"), body["messages"])}
    if body.get("max_tokens") is not None:
        out["max_completion_tokens"] = body["max_tokens"]
    stop = body.get("stop_sequences")
    if stop:
        if len(stop) > MAX_STOP:
            raise _refuse("stop_sequences")
        out["stop"] = list(stop)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stream"):
        out["stream"] = True
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        choice, serial = _tool_choice(body["tool_choice"])
        if out.get("tools"):  # OpenAI takes a tool choice only beside tools
            out["tool_choice"] = choice
            if serial:
                out["parallel_tool_calls"] = False
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id"):
        out["user"] = str(metadata["user_id"])
    tier = body.get("service_tier")
    if tier == "standard_only":
        out["service_tier"] = "default"
    effort = _effort(body.get("thinking"), body.get("output_config"))
    if effort is not None:
        out["reasoning_effort"] = effort
    edits = (body.get("context_management") or {}).get("edits") or []
    if any(not str(e.get("type", "") if isinstance(e, dict) else "").startswith("clear_thinking") for e in edits):
        raise _refuse("context_management")
    return out
