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

_ROOT = Path(__file__).resolve().parents[2]
_SPECIALS = ("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_name|>")
_FIRST_FREE_ID = {"o200k_base": 200100, "cl100k_base": 100300}


@functools.cache
def markup(name: str) -> tiktoken.Encoding:
    """`name` extended with the chat markup's special tokens (tiktoken's documented way)."""
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_ROOT / ".venv" / "share" / "tiktoken"))
    base = tiktoken.get_encoding(name)
    first = _FIRST_FREE_ID[name]
    return tiktoken.Encoding(
        name=f"{name}_chatml",
        pat_str=base._pat_str,
        mergeable_ranks=base._mergeable_ranks,
        special_tokens={**base._special_tokens, **{s: first + i for i, s in enumerate(_SPECIALS)}},
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
