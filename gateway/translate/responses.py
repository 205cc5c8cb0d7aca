"""A Responses API request served by an Anthropic messages target, for the stateless subset that
maps faithfully (docs/billing.md, "Translation between formats"; the rules are
gateway/billing/translation.py, RESPONSES_TO_MESSAGES).

The request is checked field by field under the Responses names, rewritten as the chat
completions body it is equivalent to, and sent through the chat-to-messages translation, so
both share one mapping of messages, tools and sampling. The answer (`reply`) and its stream
(`ResponsesFromMessages`) come back as a Response and Responses events; usage is billed from
the target's own format before either is built.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.billing.translation import FIELDS, REFUSED, RESPONSES_TO_MESSAGES
from gateway.translate.errors import Untranslatable
from gateway.translate.replies import usage_to_chat
from gateway.translate.to_messages import to_messages

__all__ = ["ResponsesFromMessages", "reply", "to_messages_body"]

_RULES = FIELDS[RESPONSES_TO_MESSAGES]
_TARGET = "messages"
# `include` values that ask for output of something that never reaches the target.
_INCLUDE_DROPPED = frozenset(
    {
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
    }
)
# Top-level fields whose value is the default, so only another value needs an equivalent.
_DEFAULTS: dict[str, Any] = {"top_logprobs": 0, "background": False, "truncation": "disabled", "store": False}


def _refuse(field: str, why: str | None = None) -> Untranslatable:
    return Untranslatable(field, why or _RULES.get(field, _RULES["input"]).why, target=_TARGET)


def _parts(content: Any, where: str, role: str) -> str | list[dict]:
    """A message item's content as chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "content must be a string or an array of parts")
    out: list[dict] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _refuse(at, "an image part needs an image_url (a file_id names a file the target cannot read)")
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _refuse(at, f"content parts of type '{kind}' have no equivalent here")
    return out


def _arguments(item: dict, where: str) -> str:
    arguments = item.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _refuse(f"{where}.arguments", "function call arguments must be a JSON object")
    return json.dumps(parsed, ensure_ascii=False)


def _messages(body: dict) -> list[dict]:
    raw = body.get("input")
    items: list = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    out: list[dict] = []
    instructions = body.get("instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    started = False
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message" and "role" in item:
            role = item.get("role")
            if role in ("system", "developer"):
                if started:
                    raise _refuse(f"{where}.role", "a system message after the conversation started has no equivalent")
                out.append({"role": "system", "content": _parts(item.get("content"), where, "system")})
                continue
            if role not in ("user", "assistant"):
                raise _refuse(f"{where}.role", f"messages of role '{role}' have no equivalent")
            started = True
            out.append({"role": role, "content": _parts(item.get("content"), where, role)})
        elif kind == "function_call":
            started = True
            call = {
                "id": str(item.get("call_id") or ""),
                "type": "function",
                "function": {"name": str(item.get("name") or ""), "arguments": _arguments(item, where)},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            started = True
            output = item.get("output")
            content = output if isinstance(output, str) else _parts(output, where, "tool")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": content})
        elif kind == "reasoning":
            raise _refuse(where, "reasoning items are another model's own reasoning (often encrypted), unreadable here")
        else:
            raise _refuse(f"{where}.type", f"input items of type '{kind}' have no equivalent")
    return out


def _tools(tools: Any) -> list[dict]:
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _refuse(f"tools[{i}].type", f"'{kind}' tools have no equivalent: only function tools do")
        if tool.get("strict") is not False:
            raise _refuse(
                f"tools[{i}].strict",
                "strict schema adherence (the Responses default) has no faithful equivalent: send strict: false",
            )
        function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _refuse("tool_choice", "only auto, none, required and a named function have an equivalent")


def _check(body: dict) -> None:
    for name, value in body.items():
        rule = _RULES.get(name)
        if rule is None:
            raise _refuse(name, "the translation table does not know this field")
        if value is None or (name in _DEFAULTS and value == _DEFAULTS[name]):
            continue
        if rule.how == REFUSED and name != "reasoning":
            raise _refuse(name)
    if body.get("store") is True:
        raise _refuse("store")
    if body.get("truncation") is not None and body["truncation"] != "disabled":
        raise _refuse("truncation")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        raise _refuse("reasoning")
    text = body.get("text")
    if isinstance(text, dict):
        fmt = text.get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
            raise _refuse("text.format", "a JSON object or schema format has no faithful equivalent")
        if text.get("verbosity") is not None:
            raise _refuse("text.verbosity", "no equivalent")
    for value in body.get("include") or []:
        if value == "message.output_text.logprobs":
            raise _refuse("include", "the target returns no log probabilities")
        if value not in _INCLUDE_DROPPED:
            raise _refuse("include", f"'{value}' has no equivalent")


def to_messages_body(body: dict) -> dict:
    """The Anthropic messages body for a Responses `body` (model and output ceiling as the
    client sent them; the proxy sets the target's). Raises Untranslatable."""
    _check(body)
    chat: dict = {"model": body["model"], "messages": _messages(body)}
    for name in ("temperature", "top_p", "parallel_tool_calls", "service_tier"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("stream"):
        chat["stream"] = True
    user = body.get("safety_identifier") or body.get("user")
    if user is not None:
        chat["user"] = user
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    return to_messages(chat)


# --- the answer ----------------------------------------------------------------------------

_INCOMPLETE = {"max_tokens": "max_output_tokens", "model_context_window_exceeded": "max_output_tokens"}


def usage(u: Any) -> dict:
    """Anthropic usage as a Response's: input counts every input token, cached or not (cache
    reads as `cached_tokens`, writes as `cache_write_tokens`)."""
    chat = usage_to_chat(u)
    written = u.get("cache_creation_input_tokens") if isinstance(u, dict) else None
    details = {
        "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"],
        "cache_write_tokens": written if isinstance(written, int) and not isinstance(written, bool) else 0,
    }
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": details,
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat["total_tokens"],
    }


def _status(stop: Any) -> tuple[str, dict | None]:
    if stop in _INCOMPLETE:
        return "incomplete", {"reason": _INCOMPLETE[stop]}
    if stop == "refusal":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _text_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def _call_item(block_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "id": f"fc_{block_id}",
        "type": "function_call",
        "call_id": block_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _response(request: dict, *, rid: str, model: str, status: str, output: list, u: Any, incomplete: Any) -> dict:
    """A Response object, echoing the request's settings as the Responses API does."""
    tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": False,
        "temperature": request.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": tools,
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": u,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def reply(data: bytes, *, model: str, request: dict) -> bytes:
    """An Anthropic message as the Response the client asked for."""
    msg = json.loads(data)
    base = str(msg.get("id") or "")
    output: list[dict] = []
    for k, block in enumerate(msg.get("content") or []):
        if block.get("type") == "text":
            output.append(_text_item(f"msg_{base}_{k}", str(block.get("text") or ""), "completed"))
        elif block.get("type") == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            output.append(_call_item(str(block.get("id") or ""), str(block.get("name") or ""), arguments, "completed"))
    status, incomplete = _status(msg.get("stop_reason"))
    out = _response(
        request,
        rid=f"resp_{base}",
        model=model,
        status=status,
        output=output,
        u=usage(msg.get("usage")),
        incomplete=incomplete,
    )
    return json.dumps(out).encode()


class ResponsesFromMessages:
    """An Anthropic messages stream, read by a Responses client: every event carries its
    sequence number; each text block is a message item, each tool_use block a function_call."""

    def __init__(self, *, request: dict):
        self.request = request
        self.seq = 0
        self.rid = ""
        self.base = ""
        self.model = ""
        self.usage: dict = {}
        self.stop: Any = None
        self.output: list[dict] = []
        self.blocks: dict[int, int] = {}  # Anthropic block index -> output index
        self.texts: dict[int, list[str]] = {}  # output index -> its text (or arguments) so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}".encode()

    def _snapshot(self, status: str, u: Any = None, incomplete: Any = None) -> dict:
        return _response(
            self.request,
            rid=self.rid,
            model=self.model,
            status=status,
            output=list(self.output),
            u=u,
            incomplete=incomplete,
        )

    def _start_block(self, index: int, block: dict) -> list[bytes]:
        k = self.blocks[index] = len(self.output)
        if block.get("type") == "text":
            item = _text_item(f"msg_{self.base}_{index}", "", "in_progress")
            part = item["content"][0]
            item = {**item, "content": []}
            self.output.append(item)
            self.texts[k] = [str(block.get("text") or "")]
            out = [
                self._event("response.output_item.added", output_index=k, item=item),
                self._event(
                    "response.content_part.added", item_id=item["id"], output_index=k, content_index=0, part=part
                ),
            ]
            if block.get("text"):
                out.append(self._delta(k, str(block["text"])))
            return out
        item = _call_item(str(block.get("id") or ""), str(block.get("name") or ""), "", "in_progress")
        self.output.append(item)
        self.texts[k] = []
        return [self._event("response.output_item.added", output_index=k, item=item)]

    def _delta(self, k: int, text: str) -> bytes:
        item = self.output[k]
        return self._event(
            "response.output_text.delta", item_id=item["id"], output_index=k, content_index=0, delta=text, logprobs=[]
        )

    def _stop_block(self, k: int) -> list[bytes]:
        item = self.output[k]
        text = "".join(self.texts[k])
        if item["type"] == "message":
            done = _text_item(item["id"], text, "completed")
            self.output[k] = done
            part = done["content"][0]
            return [
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=k,
                    content_index=0,
                    text=text,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=k, content_index=0, part=part
                ),
                self._event("response.output_item.done", output_index=k, item=done),
            ]
        arguments = text or "{}"
        done = {**item, "arguments": arguments, "status": "completed"}
        self.output[k] = done
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=k,
                name=item["name"],
                arguments=arguments,
            ),
            self._event("response.output_item.done", output_index=k, item=done),
        ]

    def feed(self, data: bytes) -> list[bytes]:
        try:
            event = json.loads(data)
        except ValueError:
            return []
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            message = event.get("message") or {}
            self.base = str(message.get("id") or "")
            self.rid = f"resp_{self.base}"
            self.model = str(message.get("model") or "")
            self.usage = dict(message.get("usage") or {})
            snapshot = self._snapshot("in_progress")
            return [
                self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot),
            ]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") in ("text", "tool_use"):
                return self._start_block(event.get("index", 0), block)
            return []  # thinking blocks: the request asked for no reasoning, and none is shown
        if kind == "content_block_delta":
            k = self.blocks.get(event.get("index", 0))
            delta = event.get("delta") or {}
            if k is None:
                return []
            if delta.get("type") == "text_delta":
                self.texts[k].append(str(delta.get("text") or ""))
                return [self._delta(k, str(delta.get("text") or ""))]
            if delta.get("type") == "input_json_delta":
                piece = str(delta.get("partial_json") or "")
                self.texts[k].append(piece)
                item_id = self.output[k]["id"]
                return [
                    self._event("response.function_call_arguments.delta", item_id=item_id, output_index=k, delta=piece)
                ]
            return []
        if kind == "content_block_stop":
            k = self.blocks.get(event.get("index", 0))
            return [] if k is None else self._stop_block(k)
        if kind == "message_delta":
            self.usage.update(event.get("usage") or {})
            self.stop = (event.get("delta") or {}).get("stop_reason")
            return []
        if kind == "message_stop":
            status, incomplete = _status(self.stop)
            final = self._snapshot(status, usage(self.usage), incomplete)
            return [
                self._event("response.completed" if status == "completed" else "response.incomplete", response=final)
            ]
        if kind == "error":
            error = event.get("error") or {}
            return [self._event("error", code=error.get("type"), message=str(error.get("message")), param=None)]
        return []  # ping

    def end(self) -> list[bytes]:
        return []
