"""The refusal of a field that cannot be translated faithfully."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.http.errors import GatewayError

FORMAT_NAMES = {
    "chat": "OpenAI chat completions",
    "messages": "Anthropic messages",
    "converse": "Bedrock Converse",
    "gemini": "Gemini generateContent",
}


class Untranslatable(GatewayError):
    """400 naming the field: the target has no faithful equivalent for it."""

    def __init__(self, field: str, why: str, *, target: str):
        super().__init__(
            f"'{field}' cannot be translated to the {FORMAT_NAMES[target]} format this route's targets speak: "
            f"{why} (docs/billing.md, 'Translation between formats').",
            code="untranslatable_field",
            status=400,
            param=field,
        )
        self.field = field
        self.why = why


def chat_functions(tools: Any, refuse: Callable[[str, str], Untranslatable], *, strict: bool = False) -> list[dict]:
    """The `function` of each chat completions tool, in order, for a target format that has only
    function tools: any other tool type is refused, and `strict: true` too unless the target keeps
    strict schemas (`strict`), each naming the tool."""
    functions = []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise refuse(f"tools[{i}].type", "only function tools have an equivalent")
        if not strict and function.get("strict"):
            raise refuse(f"tools[{i}].function.strict", "strict schema adherence has no faithful equivalent")
        functions.append(function)
    return functions
