"""A batch line is sent with the output ceiling its bound assumed, alone, in the parameter the
connection's provider reads: a line naming max_completion_tokens 1 and max_tokens 8,000, run by
a server that reads only max_tokens, is billed 1 output token, the ceiling the job's hold was
sized for. Slices on and off."""

from __future__ import annotations

import io
import json

import pytest

from jobs.models import JobFile
from ledger.models import Reservation
from tests.jobs.conftest import oa

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 3


def _file() -> io.BytesIO:
    body = {
        "model": "gpt-test",
        "max_completion_tokens": 1,
        "max_tokens": 8000,
        "messages": [{"role": "user", "content": "hi"}],
    }
    rows = [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        for i in range(LINES)
    ]
    return io.BytesIO(("\n".join(rows) + "\n").encode())


def test_a_batch_line_carries_its_bound_in_the_parameter_the_server_reads(gateway, wired, upstream, slices_mode):
    # given an OpenAI-format connection to a server that knows only max_tokens, under a cap
    assert wired.openai is not None
    wired.openai.options = {**wired.openai.options, "max_tokens_param": "max_tokens"}
    wired.openai.save()
    wired.budget(amount="5")
    upstream.control(completion_tokens="max", ceiling_param="max_tokens", default_max_tokens=8000)
    client = oa(gateway)

    # when lines naming both ceilings are submitted
    f = client.files.create(file=("batch.jsonl", _file()), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    upstream.job(batch.id, "completed")

    # then each line was held for 1 output token and the server billed exactly that
    bounds = JobFile.objects.get().line_bounds
    assert Reservation.objects.get().amount_nano == sum(bounds)
    [job] = upstream.jobs()
    assert job["billed"]["lines"] == LINES
    assert job["billed"]["output_tokens"] == LINES * 1
