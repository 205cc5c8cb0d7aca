"""What a provider bills as prompt tokens for a chat body, counted the way it renders one.

The reference the exact count (gateway/admission/tokens.py) is tested against, and what the fake upstream
reports with the `count_prompt` knob. It is written independently of gateway/admission/tokens.py: it
renders the whole conversation in the chat markup, with the framing as special tokens, and
tokenizes it in one pass with tiktoken:

    <|im_start|>{role}[<|im_name|>{name}]<|im_sep|>{content}<|im_end|>  ...  <|im_start|>assistant<|im_sep|>

which is the framing OpenAI documents (3 tokens per message, 1 per name, 3 priming the reply).
A list content's text parts are joined with `joiner` (undocumented: tests try several). Other
prompt-side JSON (tools, tool calls) is tokenized as compact JSON. Caller text that spells a
markup token is not escaped (random test strings never do).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken_ext import openai_public

_ROOT = Path(__file__).resolve().parents[2]
_SPECIALS = ("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_name|>")
_FIRST_FREE_ID = {"o200k_base": 200100, "cl100k_base": 100300}


@functools.cache
def markup(name: str) -> tiktoken.Encoding:
    """`name` extended with the chat markup's special tokens (tiktoken's documented way)."""
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_ROOT / ".venv" / "share" / "tiktoken"))
    # The encoding's constructor arguments, read from its file again: the registered encoding
    # no longer holds its ranks in Python once capgate loaded it (gateway/admission/tokens.py).
    base = getattr(openai_public, name)()
    first = _FIRST_FREE_ID[name]
    return tiktoken.Encoding(
        name=f"{name}_chatml",
        pat_str=base["pat_str"],
        mergeable_ranks=base["mergeable_ranks"],
        special_tokens={**base["special_tokens"], **{s: first + i for i, s in enumerate(_SPECIALS)}},
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(body: dict[str, Any], joiner: str = "\n") -> tuple[str, str]:
    """The rendered conversation, and the tokens of JSON parts counted beside it."""
    out: list[str] = []
    side = ""
    for key in ("tools", "functions", "response_format"):
        if body.get(key) is not None:
            side += _json({key: body[key]})
    for message in body["messages"]:
        head = message["role"]
        if isinstance(message.get("name"), str):
            head += "<|im_name|>" + message["name"]
        content = message.get("content")
        if isinstance(content, list):
            texts = [
                p["text"]
                for p in content
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            ]
            content = joiner.join(texts)
        text = content if isinstance(content, str) else ""
        out.append(f"<|im_start|>{head}<|im_sep|>{text}<|im_end|>")
        rest = {k: v for k, v in message.items() if k not in ("role", "name", "content")}
        if rest:
            side += _json(rest)
    out.append("<|im_start|>assistant<|im_sep|>")
    return "".join(out), side


def prompt_tokens(body: dict[str, Any], encoding: str, joiner: str = "\n") -> int:
    enc = markup(encoding)
    text, side = render(body, joiner)
    return len(enc.encode(text, allowed_special=set(_SPECIALS))) + (len(enc.encode_ordinary(side)) if side else 0)


def responses_messages(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body as the chat conversation the provider renders, with the prompt-side JSON
    (tools, the text format) beside it: `instructions` as a developer message, a string input
    as a user message, a call the model made as an assistant message addressed to the tool
    (`assistant to=functions.{name}`, its arguments as the text), and the call's output as a
    message from the tool (`functions.{name} to=assistant`). A reasoning item is billed as its
    summary and its encrypted content read as text (what the provider decrypts is no longer
    than that); any other item as its JSON."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "developer", "content": body["instructions"]})
    raw = body.get("input")
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    names = {i.get("call_id"): i.get("name") for i in items if isinstance(i, dict) and "name" in i}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = [{"type": "text", "text": p["text"]} for p in content if isinstance(p.get("text"), str)]
            messages.append({"role": item["role"], "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            text = item.get("arguments") if kind == "function_call" else item.get("input")
            messages.append({"role": f"assistant to=functions.{item['name']}", "content": text})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            if isinstance(output, list):
                output = [{"type": "text", "text": p["text"]} for p in output if isinstance(p.get("text"), str)]
            role = f"functions.{names.get(item.get('call_id'), 'tool')} to=assistant"
            messages.append({"role": role, "content": output})
        elif kind == "reasoning":
            summary = "".join(s.get("text", "") for s in item.get("summary") or [])
            messages.append({"role": "assistant", "content": summary + (item.get("encrypted_content") or "")})
        else:
            messages.append({"role": "assistant", "content": _json(item)})
    side = {k: body[k] for k in ("tools",) if body.get(k) is not None}
    if isinstance(body.get("text"), dict) and body["text"].get("format") is not None:
        side["response_format"] = body["text"]["format"]
    return {"messages": messages, **side}


def responses_prompt_tokens(body: dict[str, Any], encoding: str, joiner: str = "\n") -> int:
    """What the provider bills as input tokens for a Responses body (before earlier context)."""
    return prompt_tokens(responses_messages(body), encoding, joiner)
