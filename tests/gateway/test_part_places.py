"""Every place the official SDKs' request types let an image, file or audio part sit is a place
the part walker (gateway/admission/parts.py) looks: the places are read from the installed
openai and anthropic TypedDicts, so an SDK release that adds one (a new tool output that carries
images, a new media part) fails here instead of being bounded by the bytes of its JSON stub.

A TypedDict is a media part when its `type` is one the walker counts or its name says image,
file, audio, document, screenshot or video; the few such names that are not parts (tools,
citations, a part's own fields) are listed below with the reason."""

from __future__ import annotations

import re
import typing

import pytest
import typing_extensions
from anthropic.types.beta.message_create_params import MessageCreateParamsBase as BetaMessageCreateParams

from gateway.admission.bounds import SHAPERS
from gateway.admission.parts import CONTAINER_FIELDS, IMAGE_PARTS, PART_FIELDS, UNBOUNDED_PARTS
from tests.gateway.sdk_types import SDK_PARAMS

COUNTED = IMAGE_PARTS | UNBOUNDED_PARTS
MEDIA_NAME = re.compile(r"Image|File|Audio|Document|Screenshot|Video")
PARAMS = {**{k: v for k, v in SDK_PARAMS.items() if k != "embeddings"}, "messages (beta)": BetaMessageCreateParams}
# The body fields each shaper walks (gateway/admission/bounds.py).
WALKED_FIELDS = {
    "chat": {"messages"},
    "messages": {"messages", "system"},
    "messages (beta)": {"messages", "system"},
    "responses": {"input"},
    "compact": {"input"},  # shaped as /v1/responses shapes its input
}
# Body fields that may hold media parts the walker does not read, each for a reason.
OTHER_FIELDS = {
    ("responses", "prompt"): "a stored prompt's variables: `prompt` is refused under a blocking cap",
}
# TypedDicts whose name says media but which are not a content part, nor hold one.
NOT_PARTS = {
    "FileSearchToolParam": "a hosted tool (refused under a blocking cap), not a part",
    "ImageGeneration": "a hosted tool (refused under a blocking cap), not a part",
    "ToolImageGeneration": "a hosted tool, not a part",
    "ImageGenerationInputImageMask": "the image generation tool's setting",
    "ImageGenerationSvg": "the image generation tool's setting",
    "ToolImageGenerationInputImageMask": "the image generation tool's setting",
    "ToolImageGenerationSvg": "the image generation tool's setting",
    "ImageGenerationCall": "an earlier generated image: its base64 result stays in the byte bound",
    "ImageGenerationCallError": "an earlier image generation's error",
    "ResponseFileSearchToolCallParam": "an earlier file search's results: text, in the byte bound",
    "ApplyPatchCallOperationCreateFile": "a patch operation: text, in the byte bound",
    "ApplyPatchCallOperationDeleteFile": "a patch operation: text, in the byte bound",
    "ApplyPatchCallOperationUpdateFile": "a patch operation: text, in the byte bound",
    "ActionScreenshot": "a computer-use action asking for a screenshot: the screenshot comes back as output",
    "Screenshot": "a computer-use action asking for a screenshot",
    "AnnotationContainerFileCitation": "a citation in earlier output text",
    "AnnotationFileCitation": "a citation in earlier output text",
    "AnnotationFilePath": "a citation in earlier output text",
    "Image": "the Responses `image` field: image context compression settings, free",
    "ChatCompletionAudioParam": "chat's `audio` output settings, refused under a blocking cap",
    "BrowserFileUploadConfigParam": "a browser tool's settings",
    "BrowserScreenshotConfigParam": "a browser tool's settings",
    "ComputerScreenshotConfigParam": "a computer tool's settings",
    "BetaBrowserFileUploadConfigParam": "a browser tool's settings",
    "BetaBrowserScreenshotConfigParam": "a browser tool's settings",
    "BetaComputerScreenshotConfigParam": "a computer tool's settings",
    "FileSearchTool": "a hosted tool, not a part",
}


def _args(hint: object) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) is not None else ()


def _typeddicts(hint: object) -> list[type]:
    if typing_extensions.is_typeddict(hint):
        return [typing.cast(type, hint)]
    return [td for a in _args(hint) for td in _typeddicts(a)]


def _literals(hint: object) -> list[str]:
    if typing.get_origin(hint) is typing.Literal:
        return [v for v in typing.get_args(hint) if isinstance(v, str)]
    return [v for a in _args(hint) for v in _literals(a)]


def _hints(td: type) -> dict[str, object]:
    return typing.get_type_hints(td, include_extras=True)


def _types(td: type) -> tuple[str | None, ...]:
    """The `type`s a dict of this TypedDict may carry ((None,): it has none, as a message)."""
    return tuple(_literals(_hints(td).get("type"))) or (None,)


def _walks(td: type, field: str) -> bool:
    """Whether the walker reads `field` of a dict of this TypedDict, whichever its type."""
    return field in CONTAINER_FIELDS or (_types(td) == (None,) and field in PART_FIELDS)


def _counted(container: type, field: str, part: type) -> bool:
    return all(k in COUNTED for k in _types(part)) or (_types(part) == (None,) and _walks(container, field))


def _is_media(td: type) -> bool:
    if any(k in COUNTED for k in _types(td)):
        return True
    return bool(MEDIA_NAME.search(td.__qualname__))


def _media_places(root: type, fields: set[str]) -> list[tuple[str, type, str, type, bool]]:
    """(how it was reached, the container's type, field, the media TypedDict, walked) for every
    media part reachable from the body's `fields`: walked is whether the walker reaches the
    container only through places it knows."""
    found = []
    seen: set[tuple[type, bool]] = set()
    stack: list[tuple[type, str, bool]] = []
    for name, hint in _hints(root).items():
        if name in fields:
            stack += [(td, name, True) for td in _typeddicts(hint) if td.__qualname__ not in NOT_PARTS]
    while stack:
        td, path, walked = stack.pop()
        if (td, walked) in seen:
            continue
        seen.add((td, walked))
        for field, hint in _hints(td).items():
            for child in _typeddicts(hint):
                if child.__qualname__ in NOT_PARTS:
                    continue  # nothing below it is a part either (its reason says what it is)
                here = walked and _walks(td, field)
                if _is_media(child):
                    found.append((path, td, field, child, here))
                else:
                    stack.append((child, f"{path} > {td.__qualname__}.{field}", here))
    return found


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_every_place_an_sdk_lets_a_media_part_sit_is_walked(kind):
    unknown = []
    for path, container, field, part, walked in _media_places(PARAMS[kind], WALKED_FIELDS[kind]):
        if not (walked and _counted(container, field, part)):
            where = f"{container.__qualname__} {_types(container)}.{field}"
            unknown.append(f"{part.__qualname__} (type {_types(part)}) in {where} via {path}")
    assert not unknown, "media parts the walker does not count:\n" + "\n".join(sorted(set(unknown)))


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_media_parts_outside_the_walked_fields_are_accounted_for(kind):
    root = PARAMS[kind]
    other = set(_hints(root)) - WALKED_FIELDS[kind]
    for field in sorted(other):
        places = _media_places(root, {field})
        if places:
            assert (kind.split(" ")[0], field) in OTHER_FIELDS, (
                f"body field {field!r} can hold {sorted({p[3].__qualname__ for p in places})}"
            )


def test_the_walk_finds_the_places_tool_outputs_give_images():
    # The check above is only as good as its reach: these places must be among those it found.
    found = {
        (kind, _types(container)[0], field, _types(part)[0])
        for kind in PARAMS
        for _, container, field, part, _ in _media_places(PARAMS[kind], WALKED_FIELDS[kind])
    }
    assert {
        ("responses", "function_call_output", "output", "input_image"),
        ("responses", "function_call_output", "output", "input_file"),
        ("responses", "custom_tool_call_output", "output", "input_image"),
        ("responses", "computer_call_output", "output", "computer_screenshot"),
        ("messages", "tool_result", "content", "image"),
        ("messages", "tool_result", "content", "document"),
        ("messages", "web_fetch_result", "content", "document"),
        ("chat", None, "content", "image_url"),
        ("chat", None, "audio", None),
    } <= found


IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}


@pytest.mark.parametrize(
    ("kind", "body", "images", "unbounded"),
    [
        pytest.param(
            "responses",
            {"model": "m", "input": [{"type": "a_newer_tool_output", "call_id": "c", "output": [IMAGE, IMAGE]}]},
            2,
            0,
            id="an item type the SDKs do not know yet",
        ),
        pytest.param(
            "responses",
            {"model": "m", "input": [{"type": "code_interpreter_call", "outputs": [{"type": "image", "url": "u"}]}]},
            1,
            0,
            id="code interpreter images sent back",
        ),
        pytest.param(
            "messages",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "web_fetch_tool_result",
                                "tool_use_id": "t",
                                "content": {
                                    "type": "web_fetch_result",
                                    "url": "u",
                                    "content": {"type": "document", "source": {"type": "text", "data": "x"}},
                                },
                            }
                        ],
                    }
                ],
            },
            0,
            1,
            id="a web fetch's document",
        ),
        pytest.param(
            "chat",
            {"model": "m", "messages": [{"role": "assistant", "audio": {"id": "audio_1"}}]},
            0,
            1,
            id="an assistant message's earlier audio",
        ),
    ],
)
def test_parts_are_counted_where_the_walk_finds_them(kind, body, images, unbounded):
    shape = SHAPERS[kind](body, {})
    assert (shape.images, shape.unbounded_parts) == (images, unbounded)
