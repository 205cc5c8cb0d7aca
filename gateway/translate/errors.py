"""The refusal of a field that cannot be translated faithfully."""

from __future__ import annotations

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
