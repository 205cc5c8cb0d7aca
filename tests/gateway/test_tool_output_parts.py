"""Images and files a tool sends back are parts like those in a message: the worst case bounds
each image by the model's image maximum wherever it sits (a Responses function, custom tool or
computer-use output, an Anthropic tool_result, a chat tool message), and a file the catalog
cannot bound is refused under a blocking cap there as in a message. Through HTTP, against the
fake upstream, read from the usage rows."""

from __future__ import annotations

import httpx
import pytest

from ledger.models import UsageRecord, Window
from tests.concurrency import race
from tests.conftest import usd
from tests.gateway.conftest import KEY, assert_nothing_held, wait_settled

AUTH = {"Authorization": f"Bearer {KEY}"}
N = 20  # images in one request
IMAGE_TOKENS = 1600  # the wired model's max_image_tokens
INPUT_NANO_PER_TOKEN = 15_000  # $15 per 1M input tokens
URL = "https://example.com/screen.png"


def _post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(gateway.url + path, json=body, headers=AUTH, timeout=60)


def _function_call_output(parts: list) -> list:
    call = {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"}
    return [call, {"type": "function_call_output", "call_id": "call_1", "output": parts}]


def _custom_tool_call_output(parts: list) -> list:
    call = {"type": "custom_tool_call", "call_id": "call_1", "name": "screenshot", "input": "now"}
    return [call, {"type": "custom_tool_call_output", "call_id": "call_1", "output": parts}]


def _computer_loop(n: int) -> list:
    """A computer-use loop's turns: each call answered with a screenshot."""
    items: list = []
    for i in range(n):
        action = {"type": "screenshot"}
        items.append({"type": "computer_call", "call_id": f"c{i}", "action": action, "pending_safety_checks": []})
        items.append(
            {
                "type": "computer_call_output",
                "call_id": f"c{i}",
                "output": {"type": "computer_screenshot", "image_url": URL},
            }
        )
    return items


def _responses(items: list) -> dict:
    return {
        "model": "gpt-test",
        "input": [{"role": "user", "content": "what changed?"}, *items],
        "max_output_tokens": 50,
    }


RESPONSES_IMAGES = [{"type": "input_image", "image_url": URL}] * N
CHAT_IMAGES = [{"type": "image_url", "image_url": {"url": URL}}] * N
ANTHROPIC_IMAGES = [{"type": "image", "source": {"type": "url", "url": URL}}] * N
CHAT_CALL = {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
ANTHROPIC_CALL = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}

# (path, images in a user message, the same images in a tool's output)
PLACES = {
    "function_call_output": (
        "/v1/responses",
        _responses([{"role": "user", "content": RESPONSES_IMAGES}]),
        _responses(_function_call_output(RESPONSES_IMAGES)),
    ),
    "custom_tool_call_output": (
        "/v1/responses",
        _responses([{"role": "user", "content": RESPONSES_IMAGES}]),
        _responses(_custom_tool_call_output(RESPONSES_IMAGES)),
    ),
    "computer_call_output": (
        "/v1/responses",
        _responses([{"role": "user", "content": RESPONSES_IMAGES}]),
        _responses(_computer_loop(N)),
    ),
    "anthropic_tool_result": (
        "/v1/messages",
        {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": ANTHROPIC_IMAGES}]},
        {
            "model": "claude-test",
            "max_tokens": 50,
            "messages": [
                {"role": "user", "content": "what changed?"},
                {"role": "assistant", "content": [ANTHROPIC_CALL]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": ANTHROPIC_IMAGES}],
                },
            ],
        },
    ),
    "chat_tool_message": (
        "/v1/chat/completions",
        {"model": "gpt-test", "max_tokens": 50, "messages": [{"role": "user", "content": CHAT_IMAGES}]},
        {
            "model": "gpt-test",
            "max_tokens": 50,
            "messages": [
                {"role": "user", "content": "what changed?"},
                {"role": "assistant", "content": None, "tool_calls": [CHAT_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": CHAT_IMAGES},
            ],
        },
    ),
}


def _reserved(gateway, path: str, body: dict) -> int:
    resp = _post(gateway, path, body)
    assert resp.status_code == 200, resp.text
    wait_settled()
    return UsageRecord.objects.get(request_id=resp.headers["x-capgate-request-id"]).reserved_nano


@pytest.mark.parametrize("place", sorted(PLACES))
def test_images_in_a_tool_output_reserve_what_images_in_a_message_reserve(gateway, wired, place):
    path, in_message, in_tool_output = PLACES[place]
    message = _reserved(gateway, path, in_message)
    tool_output = _reserved(gateway, path, in_tool_output)
    images = N * IMAGE_TOKENS * INPUT_NANO_PER_TOKEN
    assert message >= images
    # the images are held in full: what differs is the text around them (a computer-use loop
    # has 20 calls besides its screenshots, the message a few hundred bytes the tool output has not)
    assert tool_output >= images
    assert tool_output >= message - 1_000 * INPUT_NANO_PER_TOKEN, (message, tool_output)


FILE_PARTS = {
    "message": _responses([{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]),
    "function_call_output": _responses(_function_call_output([{"type": "input_file", "file_id": "file-1"}])),
    "custom_tool_call_output": _responses(_custom_tool_call_output([{"type": "input_file", "file_id": "file-1"}])),
}


@pytest.mark.parametrize("place", sorted(FILE_PARTS))
def test_a_file_in_a_tool_output_is_refused_under_a_cap_as_in_a_message(gateway, wired, place):
    wired.budget(amount="100")
    resp = _post(gateway, "/v1/responses", FILE_PARTS[place])
    assert resp.status_code == 402, resp.text
    assert resp.json()["error"]["code"] == "unbounded_input_under_budget"
    assert_nothing_held()


CAP = "2"
BURST = 30


@pytest.mark.parametrize("place", ["function_call_output", "computer_call_output"])
def test_a_burst_of_tool_output_images_stays_within_the_cap(gateway, wired, upstream, slices_mode, place):
    """Each request is billed like the provider bills its images at their largest; 30 at once
    on a cap worth about four of them: recorded spend never passes the cap."""
    path, _, body = PLACES[place]
    budget = wired.budget(amount=CAP)
    upstream.control(prompt_tokens=N * IMAGE_TOKENS + 100, completion_tokens=50)

    responses = race(BURST, lambda _: _post(gateway, path, body))

    wait_settled(timeout=60)
    assert {r.status_code for r in responses} <= {200, 402}, [
        r.text for r in responses if r.status_code not in (200, 402)
    ]
    served = list(UsageRecord.objects.filter(status="served"))
    assert len(served) == sum(r.status_code == 200 for r in responses) > 0
    spent = Window.objects.get(budget=budget).spent_nano
    assert spent == sum(r.cost_nano for r in served)
    assert spent <= usd(CAP), (
        f"{len(served)} admitted, each reserving {served[0].reserved_nano / 1e9:.4f} USD and billed "
        f"{served[0].cost_nano / 1e9:.4f} USD: recorded {spent / 1e9:.4f} USD on a {CAP} USD cap"
    )
    assert all(r.excess_nano == 0 for r in served)  # each billed within what it reserved
    assert any(r.status_code == 402 for r in responses)


@pytest.mark.parametrize("place", ["function_call_output", "custom_tool_call_output", "computer_call_output"])
def test_a_batch_line_bounds_tool_output_images_as_a_message_line(wired, place):
    from jobs.sizing import size_line

    _, in_message, in_tool_output = PLACES[place]

    def bound(body: dict) -> int:
        return size_line(key=wired.key, body=body, kind="responses", sized=None, where="line 1")[1]

    # the images are most of either bound: what differs is the text around them
    assert bound(in_tool_output) >= bound(in_message) * 9 // 10


@pytest.mark.parametrize("place", sorted(FILE_PARTS))
def test_a_batch_line_with_a_file_in_a_tool_output_is_refused_under_a_cap(wired, place):
    from jobs.sizing import size_line

    # the refusal code the batch applies when a blocking budget covers the key
    refusal = size_line(key=wired.key, body=FILE_PARTS[place], kind="responses", sized=None, where="line 1")[3]
    assert refusal == "unbounded_input_under_budget"
