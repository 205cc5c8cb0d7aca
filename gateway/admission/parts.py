"""The one walk of a request body's content parts (images, files, audio), wherever the endpoint's
format lets them sit: a message's content, a tool's output of every kind (Anthropic `tool_result`,
Responses `function_call_output`, `custom_tool_call_output`, a computer-use `computer_call_output`
screenshot), a web fetch's document. Each part found is counted (an image by the model's image
bound, a part nothing bounds refused under a blocking cap) and its payload blanked, so its
base64 bytes do not inflate the text bound and a short URL does not stand in for the image.

Every shaper (chat, messages, responses; batch lines and translated bodies go through the same
shapers) walks with this, and tests/gateway/test_part_places.py checks `CONTAINER_FIELDS` against every
place the official SDKs' request types let an image, file or audio part appear.
"""

from __future__ import annotations

from typing import Any

from gateway.http.errors import bad_request

# Part types bounded per image by the model's image maximum. `computer_screenshot` is the
# Responses computer-use loop's screenshot (computer_call_output.output), an image input.
IMAGE_PARTS = frozenset({"image_url", "image", "input_image", "computer_screenshot"})
# Part types nothing in the catalog bounds: refused under a blocking cap.
UNBOUNDED_PARTS = frozenset({"input_audio", "audio", "file", "document", "input_file", "video"})
# Where parts sit: every dict that is not itself a part may hold parts (a list of them, or one)
# under these fields, whatever its type, so an item type newer than the SDKs the table was checked
# against is walked too. The places the SDKs name today:
#   content: a chat or Anthropic message, a Responses message item, an Anthropic tool_result, a
#            web_fetch_tool_result (a web_fetch_result, whose content is a document)
#   output:  a Responses function_call_output or custom_tool_call_output (a string or a list of
#            input parts), a computer_call_output (one computer_screenshot)
#   outputs: a Responses code_interpreter_call sent back (logs and the images the code produced)
CONTAINER_FIELDS = ("content", "output", "outputs")
# Fields of a typeless dict (a message) whose value is itself one part of this kind: a chat
# assistant message's `audio` ({"id": ...}) puts an earlier audio answer back into the prompt.
PART_FIELDS = {"audio": "audio"}


class PartCounter:
    """Walks a body's parts, counting images and unboundable parts and blanking their payload
    (`{"type": kind}` is what the text bound sees). It refuses a part whose `type` is not a
    string (a 400 naming where), so nothing after admission meets one (a list there is
    unhashable, a dict unprintable as a name)."""

    def __init__(self) -> None:
        self.images = 0
        self.unbounded = 0

    def strip(self, value: Any, *, where: str) -> Any:
        """`value` (a list of items or parts, or one) with every part in it counted and blanked."""
        if isinstance(value, list):
            return [self._one(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return self._one(value, where)

    def _one(self, item: Any, where: str) -> Any:
        if not isinstance(item, dict):
            return item
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise bad_request(f"{where}.type must be a string.", param=f"{where}.type")
        if kind in IMAGE_PARTS:
            self.images += 1
            return {"type": kind}
        if kind in UNBOUNDED_PARTS:
            self.unbounded += 1
            return {"type": kind}
        out = {**item, **{f: self.strip(item[f], where=f"{where}.{f}") for f in CONTAINER_FIELDS if f in item}}
        if kind is None:
            for f, part in PART_FIELDS.items():
                if item.get(f) is not None:
                    self.unbounded += 1
                    out[f] = {"type": part}
        return out
