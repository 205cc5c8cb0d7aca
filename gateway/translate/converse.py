"""An OpenAI chat completions or Anthropic messages request as a Bedrock Converse request
(docs/billing.md, "Translation between formats"; the rules are gateway/billing/translation.py),
and the shape the bound is taken from.

Both directions translate straight to Converse (not through each other), so a refusal names
the client's own field. The body keeps `model` and `stream` at the top for the proxy; the
adapter (gateway/providers/bedrock_converse.py) moves them into the path, and an output ceiling
the gateway injects (`maxTokens`) into `inferenceConfig`.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from django.conf import settings

from gateway.admission.bounds import Shape
from gateway.billing import undated
from gateway.billing.translation import (
    CHAT_TO_CONVERSE,
    DROPPED_BETAS,
    FIELDS,
    MESSAGES_TO_CONVERSE,
    REFUSED,
)
from gateway.http.errors import bad_request
from gateway.translate.errors import Untranslatable, chat_functions

_TARGET = "converse"
# The image formats Converse takes, by media type.
IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_CHAT_DEFAULTS: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "n": 1}
_TIERS = {"default", "flex", "priority"}
# Reasoning efforts Converse's outputConfig.effort takes, by the client format's names.
CHAT_EFFORTS = {"low", "medium", "high", "xhigh"}
MESSAGES_EFFORTS = {"low", "medium", "high", "max"}


class _Refuser:
    def __init__(self, direction: tuple[str, str]):
        self.rules = FIELDS[direction]

    def __call__(self, field: str, why: str | None = None) -> Untranslatable:
        return Untranslatable(field, why or self.rules.get(field, self.rules["messages"]).why, target=_TARGET)


def _image(media: Any, data: Any, where: str, refuse: _Refuser) -> dict:
    fmt = IMAGE_FORMATS.get(str(media).lower())
    if fmt is None:
        raise refuse(where, f"Converse takes png, jpeg, gif and webp images, not '{media}'")
    if not isinstance(data, str):
        raise refuse(where, "an image needs its base64 data")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise refuse(where, "the image data is not valid base64") from None
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def _merge(turns: list[tuple[str, list[dict]]]) -> list[dict]:
    """Converse turns alternate: consecutive ones of a role merge, tool results first."""
    out: list[dict] = []
    for role, content in turns:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": list(content)})
    for turn in out:
        turn["content"].sort(key=lambda b: "toolResult" not in b)
    return out


def _inference(out: dict, *, ceiling: Any, stop: Any, temperature: Any, top_p: Any, refuse: _Refuser) -> None:
    config: dict = {}
    if ceiling is not None:
        config["maxTokens"] = ceiling
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if temperature is not None:
        if not isinstance(temperature, int | float) or isinstance(temperature, bool) or not 0 <= temperature <= 1:
            raise refuse("temperature")
        config["temperature"] = temperature
    if top_p is not None:
        config["topP"] = top_p
    if config:
        out["inferenceConfig"] = config


def _tool_spec(name: Any, description: Any, schema: Any, strict: Any) -> dict:
    spec: dict = {"name": str(name or ""), "inputSchema": {"json": schema or {"type": "object"}}}
    if description is not None:
        spec["description"] = description
    if strict:
        spec["strict"] = True
    return {"toolSpec": spec}


# --- /v1/chat/completions ----------------------------------------------------------------------

_chat_refuse = _Refuser(CHAT_TO_CONVERSE)


def _chat_content(content: Any, where: str) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    out: list[dict] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                out.append({"text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"text": part["refusal"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url.startswith("data:"):
                raise _chat_refuse(at, "Converse takes an image's bytes, not a URL: send it as a base64 data URL")
            head, sep, data = url.partition(",")
            if not sep or not head.endswith(";base64"):
                raise _chat_refuse(at, "an image data URL must be base64")
            out.append(_image(head[len("data:") : -len(";base64")], data, at, _chat_refuse))
        else:
            raise _chat_refuse(at, f"content parts of type '{kind}' have no equivalent")
    return out


def _chat_tool_use(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise _chat_refuse(where, "only function tool calls have an equivalent")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        raise _chat_refuse(where, "tool-call arguments must be a JSON object")
    return {
        "toolUse": {"toolUseId": str(call.get("id") or ""), "name": str(function.get("name") or ""), "input": arguments}
    }


def _chat_messages(messages: list) -> tuple[list[dict], list[dict]]:
    system: list[dict] = []
    turns: list[tuple[str, list[dict]]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if m.get("name") is not None:
            raise _chat_refuse(f"{where}.name", "participant names have no equivalent")
        if role in ("system", "developer"):
            blocks = _chat_content(m.get("content"), where)
            if any("text" not in b for b in blocks):
                raise _chat_refuse(where, "system messages may hold text only")
            if turns:  # after the conversation started: Converse's system role, at its place
                turns.append(("system", blocks))
            else:
                system += blocks
        elif role == "user":
            turns.append(("user", _chat_content(m.get("content"), where)))
        elif role == "assistant":
            if m.get("audio") is not None or m.get("function_call") is not None:
                raise _chat_refuse(where, "assistant audio and legacy function calls have no equivalent")
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _chat_refuse(f"{where}.tool_calls", "tool_calls must be an array")
            uses = [_chat_tool_use(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
            turns.append(("assistant", _chat_content(m.get("content"), where) + uses))
        elif role == "tool":
            content = m.get("content")
            blocks = [{"text": content}] if isinstance(content, str) else _chat_content(content, where)
            result = {"toolUseId": str(m.get("tool_call_id") or ""), "content": blocks or [{"text": ""}]}
            turns.append(("user", [{"toolResult": result}]))
        else:
            raise _chat_refuse(f"{where}.role", f"messages of role '{role}' have no equivalent")
    return system, _merge(turns)


def _chat_tools(body: dict) -> dict | None:
    tools = body.get("tools")
    if not tools:
        return None
    # Converse keeps strict schemas (toolSpec.strict), so strict tools are carried, not refused.
    specs = [
        _tool_spec(f.get("name"), f.get("description"), f.get("parameters"), f.get("strict"))
        for f in chat_functions(tools, _chat_refuse, strict=True)
    ]
    config: dict = {"tools": specs}
    choice = body.get("tool_choice")
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        config["toolChoice"] = {"tool": {"name": str((choice.get("function") or {}).get("name") or "")}}
    elif choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice is not None:
        raise _chat_refuse("tool_choice")
    return config


def _response_format(fmt: Any) -> dict | None:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    schema = fmt.get("json_schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
        raise _chat_refuse("response_format")
    definition: dict = {"schema": json.dumps(schema["schema"], ensure_ascii=False)}
    if schema.get("name"):
        definition["name"] = str(schema["name"])
    if schema.get("description"):
        definition["description"] = str(schema["description"])
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}}}


def from_chat(body: dict) -> dict:
    """The Converse body for a chat completions `body`. Raises Untranslatable."""
    rules = FIELDS[CHAT_TO_CONVERSE]
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            raise _chat_refuse(name, "the translation table does not know this field")
        if value is None or (name in _CHAT_DEFAULTS and value == _CHAT_DEFAULTS[name]):
            continue
        if rule.how == REFUSED or name == "n":
            raise _chat_refuse(name)
    if body.get("tools") and body.get("parallel_tool_calls") is False:  # without tools, neither can matter
        raise _chat_refuse("parallel_tool_calls")
    if body.get("tools") and body.get("tool_choice") == "none":
        raise _chat_refuse("tool_choice")
    system, messages = _chat_messages(body["messages"])
    out: dict = {"model": body["model"], "messages": messages}
    if system:
        out["system"] = system
    _inference(
        out,
        ceiling=body.get("max_completion_tokens") or body.get("max_tokens"),
        stop=body.get("stop"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        refuse=_chat_refuse,
    )
    tools = _chat_tools(body)
    if tools is not None:
        out["toolConfig"] = tools
    tier = body.get("service_tier")
    if tier in _TIERS:
        out["serviceTier"] = {"type": tier}
    elif tier not in (None, "auto"):
        raise _chat_refuse("service_tier")
    if any(m != "text" for m in body.get("modalities") or []):
        raise _chat_refuse("modalities")
    output = _response_format(body.get("response_format")) or {}
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in CHAT_EFFORTS:
            raise _chat_refuse("reasoning_effort")
        output["effort"] = effort
    if output:
        out["outputConfig"] = output
    if body.get("stream"):
        out["stream"] = True
    return out


# --- /v1/messages ------------------------------------------------------------------------------

_messages_refuse = _Refuser(MESSAGES_TO_CONVERSE)


def _cache_point(control: Any, where: str) -> dict:
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise _messages_refuse(f"{where}.cache_control", "only ephemeral cache control has an equivalent")
    point: dict = {"type": "default"}
    if control.get("ttl") is not None:
        point["ttl"] = control["ttl"]
    return {"cachePoint": point}


def _with_cache(block: dict, converted: dict, where: str) -> list[dict]:
    control = block.get("cache_control")
    return [converted] if control is None else [converted, _cache_point(control, where)]


def _message_image(block: dict, where: str) -> dict:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise _messages_refuse(where, "Converse takes an image's bytes: only base64 image sources have an equivalent")
    return _image(source.get("media_type"), source.get("data"), where, _messages_refuse)


def _result_content(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"text": content}]
    out: list[dict] = []
    for j, block in enumerate(content or []):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            out.append({"text": str(block.get("text", ""))})
        elif kind == "image":
            out.append(_message_image(block, at))
        else:
            raise _messages_refuse(at, f"tool result blocks of type '{kind}' have no equivalent")
    return out or [{"text": ""}]


def _message_blocks(content: Any, where: str, role: str) -> list[dict]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    out: list[dict] = []
    for j, block in enumerate(content or []):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        converted: dict
        if kind == "text":
            converted = {"text": str(block.get("text", ""))}
        elif kind == "image":
            converted = _message_image(block, at)
        elif kind == "tool_use" and role == "assistant":
            use = {"toolUseId": str(block.get("id") or ""), "name": str(block.get("name") or "")}
            converted = {"toolUse": use | {"input": block.get("input") or {}}}
        elif kind == "tool_result" and role == "user":
            result: dict = {
                "toolUseId": str(block.get("tool_use_id") or ""),
                "content": _result_content(block.get("content"), f"{at}.content"),
            }
            if block.get("is_error"):
                result["status"] = "error"
            converted = {"toolResult": result}
        else:
            raise _messages_refuse(at, f"blocks of type '{kind}' have no equivalent")
        out += _with_cache(block, converted, at)
    return out


def _system(system: Any, where: str = "system") -> list[dict]:
    if not system:
        return []
    if isinstance(system, str):
        return [{"text": system}]
    out: list[dict] = []
    for j, block in enumerate(system):
        at = f"{where}[{j}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise _messages_refuse(at, f"system blocks of type '{kind}' have no equivalent")
        out += _with_cache(block, {"text": str(block.get("text", ""))}, at)
    return out


_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict"}


def _message_tools(body: dict) -> dict | None:
    tools = body.get("tools")
    if not tools:
        return None
    specs: list[dict] = []
    for i, tool in enumerate(tools):
        kind = undated(str(tool.get("type") or "custom"))
        if kind != "custom":
            raise _messages_refuse(f"tools[{i}].type", f"Anthropic's '{kind}' tool has no equivalent")
        for key in sorted(set(tool) - _TOOL_KEYS):
            if tool[key] not in (None, False):
                raise _messages_refuse(f"tools[{i}].{key}", "this tool setting has no equivalent")
        spec = _tool_spec(tool.get("name"), tool.get("description"), tool.get("input_schema"), tool.get("strict"))
        specs += _with_cache(tool, spec, f"tools[{i}]")
    config: dict = {"tools": specs}
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = str(choice.get("type"))
        if choice.get("disable_parallel_tool_use"):
            raise _messages_refuse("tool_choice")
        if kind in ("auto", "any"):
            config["toolChoice"] = {kind: {}}
        elif kind == "tool":
            config["toolChoice"] = {"tool": {"name": str(choice.get("name") or "")}}
        else:
            raise _messages_refuse("tool_choice", f"tool choice '{kind}' has no equivalent")
    return config


def _output_config(thinking: Any, config: Any) -> dict:
    """Converse's outputConfig for a messages request's thinking and output_config: adaptive
    thinking at output_config's effort (Anthropic's default, high, when absent) and a JSON-schema
    output format. A thinking token budget has no equivalent."""
    config = config if isinstance(config, dict) else {}
    for key in sorted(set(config) - {"effort", "format"}):
        if config[key] is not None:
            raise _messages_refuse(f"output_config.{key}", "this output setting has no equivalent")
    out: dict = {}
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _messages_refuse("output_config.format", "only a JSON schema output format has an equivalent")
        definition = {"schema": json.dumps(fmt["schema"], ensure_ascii=False)}
        out["textFormat"] = {"type": "json_schema", "structure": {"jsonSchema": definition}}
    effort = config.get("effort")
    if effort is not None and effort not in MESSAGES_EFFORTS:
        raise _messages_refuse("output_config.effort", f"effort '{effort}' has no equivalent")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in (None, "disabled", "adaptive"):
        raise _messages_refuse("thinking", "a thinking token budget has no equivalent; adaptive thinking maps")
    if kind == "adaptive":
        effort = effort or "high"
    if effort is not None:
        out["effort"] = effort
    return out


def check_betas(headers: dict[str, str]) -> None:
    """anthropic-beta values only an Anthropic target could act on are refused."""
    for value in (headers.get("anthropic-beta") or "").split(","):
        beta = undated(value.strip())
        if beta and beta not in DROPPED_BETAS:
            raise _messages_refuse(f"anthropic-beta: {beta}", "this beta changes what an Anthropic model does")


def from_messages(body: dict, headers: dict[str, str] | None = None) -> dict:
    """The Converse body for a messages `body`. Raises Untranslatable."""
    check_betas(headers or {})
    rules = FIELDS[MESSAGES_TO_CONVERSE]
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            raise _messages_refuse(name, "the translation table does not know this field")
        if value is not None and rule.how == REFUSED:
            raise _messages_refuse(name)
    output = _output_config(body.get("thinking"), body.get("output_config"))
    edits = (body.get("context_management") or {}).get("edits") or []
    if any(not str(e.get("type", "") if isinstance(e, dict) else "").startswith("clear_thinking") for e in edits):
        raise _messages_refuse("context_management")
    turns: list[tuple[str, list[dict]]] = []
    for i, m in enumerate(body["messages"]):
        role = m.get("role")
        if role == "system":  # a system message between turns: Converse's system role, at its place
            turns.append((role, _system(m.get("content"), f"messages[{i}].content")))
            continue
        if role not in ("user", "assistant"):
            raise _messages_refuse(f"messages[{i}].role", f"messages of role '{role}' have no equivalent")
        turns.append((role, _message_blocks(m.get("content"), f"messages[{i}]", role)))
    messages = _merge(turns)
    if body.get("cache_control") is not None and messages:
        messages[-1]["content"].append(_cache_point(body["cache_control"], "cache_control"))
    out: dict = {"model": body["model"], "messages": messages}
    system = _system(body.get("system"))
    if system:
        out["system"] = system
    _inference(
        out,
        ceiling=body.get("max_tokens"),
        stop=body.get("stop_sequences"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        refuse=_messages_refuse,
    )
    tools = _message_tools(body)
    if tools is not None:
        out["toolConfig"] = tools
    elif isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") not in ("auto", "none", None):
        raise _messages_refuse("tool_choice", "a tool choice needs tools")
    if output:
        out["outputConfig"] = output
    if body.get("service_tier") == "standard_only":
        out["serviceTier"] = {"type": "default"}
    if body.get("stream"):
        out["stream"] = True
    return out


# --- the bound ---------------------------------------------------------------------------------


def _strip_images(node: Any, counter: list[int]) -> Any:
    """The body without image bytes (each image is bounded by the model's maximum instead)."""
    if isinstance(node, dict):
        if set(node) == {"image"} and isinstance(node["image"], dict):
            counter[0] += 1
            return {"image": {"format": node["image"].get("format")}}
        return {k: _strip_images(v, counter) for k, v in node.items()}
    if isinstance(node, list):
        return [_strip_images(v, counter) for v in node]
    return node


def _has_1h_cache(body: dict) -> bool:
    stack: list[Any] = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            point = item.get("cachePoint")
            if isinstance(point, dict) and point.get("ttl") not in (None, "5m"):
                if point.get("ttl") != "1h":
                    raise bad_request("cache_control.ttl must be '5m' or '1h'.", param="cache_control")
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def shape_converse(body: dict) -> Shape:
    """The bound of a translated Converse body: its bytes without image data (plus framing and
    the tool-use prompt), each image at the model's maximum, the output ceiling it names."""
    images = [0]
    billed = _strip_images(body, images)
    cfg = settings.CAPGATE
    raw = json.dumps(billed, ensure_ascii=False, separators=(",", ":")).encode()
    overhead = cfg["PER_MESSAGE_OVERHEAD_TOKENS"] * len(body["messages"]) + cfg["PER_REQUEST_OVERHEAD_TOKENS"]
    if body.get("toolConfig"):
        overhead += cfg["TOOL_USE_OVERHEAD_TOKENS"]
    ceiling = (body.get("inferenceConfig") or {}).get("maxTokens")
    tier = (body.get("serviceTier") or {}).get("type")
    return Shape(
        kind="converse",
        model=str(body["model"]),
        text_tokens=len(raw) + overhead,
        images=images[0],
        unbounded_parts=0,
        max_output=ceiling,
        output_param="maxTokens" if ceiling else None,
        choices=1,
        stream=bool(body.get("stream")),
        cache_1h=_has_1h_cache(body),
        service_tier=tier,
    )
