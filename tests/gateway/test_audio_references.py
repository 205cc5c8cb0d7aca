"""An assistant message naming earlier audio output (`{"role": "assistant", "audio": {"id": ...}}`):
the provider bills that audio again, as input audio tokens, which the catalog has no price for and
the body does not show (only the id). Refused under a blocking cap, naming the field."""

from __future__ import annotations

from ledger.models import UsageRecord
from tests.gateway.conftest import assert_nothing_held, wait_settled
from tests.gateway.test_billing import gpt, post  # noqa: F401  (fixtures)

AUDIO_TOKENS = 5000  # the audio output's tokens: about four minutes of speech


def _audio_reply(gateway, upstream) -> dict:
    """An assistant turn with audio output, relayed without a blocking cap (capgate refuses audio
    output under one)."""
    upstream.control(audio_tokens=AUDIO_TOKENS, completion_tokens=20)
    resp = post(
        gateway,
        {
            "model": "gpt-real",
            "messages": [{"role": "user", "content": "Say it aloud."}],
            "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": "wav"},
            "max_completion_tokens": 6000,
        },
    )
    assert resp.status_code == 200, resp.text
    audio = resp.json()["choices"][0]["message"]["audio"]
    assert set(audio) == {"id", "expires_at", "data", "transcript"}  # OpenAI's ChatCompletionAudio
    upstream.control(audio_tokens=0)
    wait_settled()
    UsageRecord.objects.all().delete()
    return audio


def _next_turn(audio_id: str) -> dict:
    return {
        "model": "gpt-real",
        "messages": [
            {"role": "user", "content": "Say it aloud."},
            {"role": "assistant", "audio": {"id": audio_id}},
            {"role": "user", "content": "Again, in text."},
        ],
        "max_completion_tokens": 20,
    }


def test_a_reference_to_earlier_audio_is_refused_under_a_blocking_cap(gateway, wired, upstream, gpt):  # noqa: F811
    audio = _audio_reply(gateway, upstream)
    wired.budget(amount="5")
    sent = upstream.stats()["requests"]
    resp = post(gateway, _next_turn(audio["id"]))
    assert resp.status_code == 402, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("audio_reference_under_budget", "messages[].audio")
    assert "messages[].audio" in error["message"]
    assert upstream.stats()["requests"] == sent  # nothing reached the provider
    assert_nothing_held()


def test_under_alert_budgets_only_the_reference_is_sent_and_its_audio_billed(gateway, wired, upstream, gpt):  # noqa: F811
    audio = _audio_reply(gateway, upstream)
    wired.budget(amount="5", mode="alert")
    resp = post(gateway, _next_turn(audio["id"]))
    assert resp.status_code == 200, resp.text
    # the provider billed the audio again as input: far past the input the body's bytes bound
    usage = resp.json()["usage"]
    assert usage["prompt_tokens_details"]["audio_tokens"] == AUDIO_TOKENS
    assert usage["prompt_tokens"] > int(resp.headers["x-capgate-reserved-input-tokens"])
    wait_settled()
    assert "prompt_tokens_details.audio_tokens=5000" in UsageRecord.objects.get().error
