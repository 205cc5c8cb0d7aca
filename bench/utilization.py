"""Budget utilization benchmark: how much of a run budget a burst may use.

    bash scripts/services.sh start
    .venv/bin/python bench/utilization.py        # ~1 minute; prints a markdown table

For each prompt (~3,000 characters of ASCII prose, of CJK prose, of Python code) and each way of
bounding it (`exact`: the model has `tokenizer: o200k_base`; `bytes`: the same model and prices
without one), a run budget is set worth exactly 10 true calls, `max_tokens: 500`:

    true call  = the prompt tokens the fake upstream bills (tests/upstream/chatml.py, o200k_base)
                 x input price + 500 completion tokens x output price
    run budget = 10 x true call

By default the fake upstream bills every reply at its full `max_tokens` (`completion_tokens:
max`), so a true call is exactly what a fitted reservation has to cover. `--reply-tokens N` bills
N-token replies instead (and a true call is N output tokens): the reservation still covers 500,
which no prompt count can shrink. Then, as a user would:
1. 30 calls at once on a new run, then (once they settled) 5 more at once on the same run;
2. 15 calls one after another (each sent as soon as the previous answered) on another new run.

Each row shows what was admitted, the bill: what the fake upstream reported in the usage of the
responses it served, priced at the catalog rates, and capgate's recorded spend, next to the cap.
Neither may exceed the cap. Prices are gpt-4o's ($2.50 / $10 per 1M tokens).

It uses its own database (capgate_bench_util), its own ports, and only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import PY, Proc, env, fresh_database, wait_http  # noqa: E402
from core.money import format_usd, usd_str  # noqa: E402
from tests.upstream import chatml  # noqa: E402 — what the fake upstream bills

DB = "capgate_bench_util"
UP_PORT, GW_PORT = 18211, 18210
KEY = "cg_bench_util_key_00000000000"
PRICE_IN, PRICE_OUT = 2_500, 10_000  # nano-USD per token: $2.50 and $10 per 1M (gpt-4o)
MAX_TOKENS = 500
TRUE_CALLS = 10
ENCODING = "o200k_base"

_ASCII = [
    "The budget is checked before the request is sent, so a call that could overspend is refused.",
    "Every reservation covers the worst case the provider may bill for the prompt and the reply.",
    "When the response arrives, the actual cost replaces the reservation and the rest returns.",
    "A team that shares one key still sees which project and which customer spent the money.",
    "Bursts are the hard case: many calls arrive at once and each must see the others' holds.",
    "Operators set the caps in the dashboard or in a file that is applied like any other change.",
    "Nothing about the provider's answer is trusted until its usage has been read and priced.",
    "If the database is unreachable, the gateway refuses new work rather than guessing.",
    "Long conversations cost more on every turn, because the whole history is sent again.",
    "A model without a price cannot be called under a blocking cap, since its cost is unknown.",
]
_CJK = [
    "预算在请求发送之前就会被检查，因此可能超支的调用会被拒绝。",
    "每一笔预留都覆盖了服务商对提示和回复可能收取的最高费用。",
    "响应到达后，实际费用会取代预留金额，剩余部分退回预算。",
    "共用一个密钥的团队仍然可以看到是哪个项目和哪个客户花了钱。",
    "突发流量是最难的情况：许多调用同时到达，每一个都必须看到其他调用的预留。",
    "运维人员可以在控制台中设置上限，也可以像其他变更一样通过文件应用。",
    "在读取并计价其用量之前，服务商返回的任何内容都不会被信任。",
    "如果数据库无法访问，网关会拒绝新的请求，而不是去猜测。",
    "长对话的每一轮都更贵，因为整个历史记录都会再次发送。",
    "没有价格的模型不能在硬性上限下调用，因为它的费用是未知的。",
]
_CODE = '''
def {name}(items: list[dict], limit: int = {n}) -> dict[str, int]:
    """Sum the {field} of each item, stopping at the limit."""
    totals: dict[str, int] = {{}}
    for item in items[:limit]:
        key = item.get("{field}_key", "default")
        totals[key] = totals.get(key, 0) + int(item["{field}"])
        if totals[key] > {n} * 1000:
            raise ValueError(f"{{key}} exceeds the {field} ceiling")
    return totals

'''


def _prose(sentences: list[str], chars: int, seed: int, sep: str) -> str:
    rng = random.Random(seed)
    out = ""
    while len(out) < chars:
        out += rng.choice(sentences) + sep
    return out[:chars]


def _code(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    fields = ["amount", "tokens", "cost", "weight", "count", "size", "delay", "score"]
    out = "from __future__ import annotations\n\n"
    i = 0
    while len(out) < chars:
        field = rng.choice(fields)
        out += _CODE.format(name=f"total_{field}_{i}", field=field, n=rng.randint(2, 999))
        i += 1
    return out[:chars]


PROMPTS = {
    "ASCII": _prose(_ASCII, 3000, 1, " "),
    "CJK": _prose(_CJK, 3000, 2, ""),
    "code": _code(3000, 3),
}


@dataclass
class Wave:
    admitted: int = 0
    refused: int = 0
    other: int = 0
    billed_nano: int = 0  # the fake upstream's usage on the served responses, priced
    reserved_input: str = ""  # x-capgate-reserved-input-tokens of an admitted call
    bound: str = ""  # x-capgate-input-bound of an admitted call

    def add(self, r: httpx.Response) -> None:
        if r.status_code == 200:
            self.admitted += 1
            usage = r.json()["usage"]
            self.billed_nano += usage["prompt_tokens"] * PRICE_IN + usage["completion_tokens"] * PRICE_OUT
            self.reserved_input = r.headers.get("x-capgate-reserved-input-tokens", "")
            self.bound = r.headers.get("x-capgate-input-bound", "")
        elif r.status_code == 402:
            self.refused += 1
        else:
            self.other += 1
            print(f"unexpected {r.status_code}: {r.text[:300]}", file=sys.stderr)


def setup() -> None:
    fresh_database(DB)
    os.environ.update(env(DB))
    import django

    django.setup()
    # Imported after django.setup(): these import models, which need the app registry.
    from catalog.models import Connection, Model, Provider, Route, RouteTarget
    from ledger.models import Budget
    from tenants.models import ApiKey, Organization, Project, hash_key

    org = Organization.objects.create(name="Utilization", slug="util")
    project = Project.objects.create(organization=org, name="Main", slug="main")
    ApiKey.objects.create(organization=org, project=project, name="k", prefix="cg_bench_u", key_hash=hash_key(KEY))
    provider = Provider.objects.create(slug="openai", name="OpenAI")
    up = Connection.objects.create(
        organization=org, name="up", kind="openai", base_url=f"http://127.0.0.1:{UP_PORT}/v1"
    )
    for route, tokenizer in (("util-exact", ENCODING), ("util-bytes", None)):
        model = Model.objects.create(
            provider=provider,
            name=f"gpt-4o-{route}",
            input_usd_per_mtok=Decimal(PRICE_IN) / 1000,
            output_usd_per_mtok=Decimal(PRICE_OUT) / 1000,
            max_output_tokens=16384,
            tokenizer=tokenizer,
        )
        RouteTarget.objects.create(route=Route.objects.create(organization=org, name=route), connection=up, model=model)
    # No organization cap: the run budget is the only (and so the tightest) ceiling.
    assert not Budget.objects.filter(organization=org).exists()


def settled(run: str, timeout: float = 20.0) -> int:
    """Wait until every call of the run is settled; its recorded spend."""
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from ledger.models import Reservation, Window

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Reservation.objects.filter(run_id=run).exists():
            window = Window.objects.filter(budget__run_id=run).first()
            if window is not None and window.reserved_nano == 0:
                return window.spent_nano
        time.sleep(0.05)
    raise RuntimeError(f"run {run} did not settle in {timeout} s")


async def _calls(body: dict, headers: dict, n: int, together: bool) -> list[httpx.Response]:
    url = f"http://127.0.0.1:{GW_PORT}/v1/chat/completions"
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        if together:
            return list(await asyncio.gather(*[client.post(url, json=body, headers=headers) for _ in range(n)]))
        return [await client.post(url, json=body, headers=headers) for _ in range(n)]


def row(label: str, mode: str, text: str, tag: str, reply_tokens: int) -> str:
    body = {"model": f"util-{mode}", "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS}
    true_prompt = chatml.prompt_tokens(body, ENCODING)
    true_nano = true_prompt * PRICE_IN + reply_tokens * PRICE_OUT
    cap_nano = TRUE_CALLS * true_nano
    cap_usd = usd_str(cap_nano)

    def headers(run: str) -> dict[str, str]:
        return {"authorization": f"Bearer {KEY}", "x-capgate-run": run, "x-capgate-run-budget-usd": cap_usd}

    burst, wave, seq = Wave(), Wave(), Wave()
    run = f"{tag}-{label}-{mode}-burst"
    for r in asyncio.run(_calls(body, headers(run), 30, together=True)):
        burst.add(r)
    settled(run)
    for r in asyncio.run(_calls(body, headers(run), 5, together=True)):
        wave.add(r)
    spent_burst = settled(run)
    run = f"{tag}-{label}-{mode}-seq"
    for r in asyncio.run(_calls(body, headers(run), 15, together=False)):
        seq.add(r)
    spent_seq = settled(run)

    billed_burst = burst.billed_nano + wave.billed_nano
    ok = max(billed_burst, spent_burst, seq.billed_nano, spent_seq) <= cap_nano and not (
        burst.other or wave.other or seq.other
    )
    reserved = burst.reserved_input or seq.reserved_input or "-"
    bound = burst.bound or seq.bound or "-"

    def usd(nano: int) -> str:
        return format_usd(nano, symbol=False)

    return (
        f"| {label} | {mode} | {len(text)} | {len(text.encode())} | {true_prompt} | {reserved} ({bound}) | "
        f"{usd(cap_nano)} | {burst.admitted}/30 | {wave.admitted}/5 | {burst.admitted + wave.admitted} | "
        f"{seq.admitted}/15 | {usd(billed_burst)} / {usd(spent_burst)} | {usd(seq.billed_nano)} / {usd(spent_seq)} | "
        f"{'yes' if ok else 'NO'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=int, default=50, help="the fake upstream's response time")
    parser.add_argument(
        "--reply-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"completion tokens the fake upstream bills per reply (default: all {MAX_TOKENS})",
    )
    args = parser.parse_args()
    reply = "max" if args.reply_tokens == MAX_TOKENS else args.reply_tokens
    (ROOT / "var").mkdir(exist_ok=True)
    setup()
    upstream = Proc("util-upstream", [PY, "-m", "tests.upstream.server", "--port", str(UP_PORT)], db=DB)
    gateway = Proc(
        "util-gateway",
        [
            str(ROOT / ".venv/bin/uvicorn"),
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(GW_PORT),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        db=DB,
    )
    try:
        wait_http(f"http://127.0.0.1:{UP_PORT}/_stats")
        wait_http(f"http://127.0.0.1:{GW_PORT}/v1/models", {"authorization": f"Bearer {KEY}"})
        httpx.post(
            f"http://127.0.0.1:{UP_PORT}/_control",
            json={"delay_ms": args.delay_ms, "count_prompt": ENCODING, "completion_tokens": reply},
        ).raise_for_status()
        tag = time.strftime("%H%M%S")
        print(
            f"# capgate budget utilization — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores\n"
        )
        print(
            f"Run budget = {TRUE_CALLS} true calls; max_tokens {MAX_TOKENS}, replies billed at "
            f"{args.reply_tokens} tokens; "
            f"${PRICE_IN / 1000:.2f} / ${PRICE_OUT / 1000:.2f} per 1M tokens; upstream delay {args.delay_ms} ms.\n"
        )
        print(
            "| prompt | count | chars | UTF-8 bytes | true prompt tokens | reserved input tokens | cap $ | "
            "30-burst | +5 wave | burst+wave | 15 sequential | billed / recorded $ (burst+wave) | "
            "billed / recorded $ (sequential) | within cap |"
        )
        print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for label, text in PROMPTS.items():
            for mode in ("exact", "bytes"):
                print(row(label, mode, text, tag, args.reply_tokens), flush=True)
    finally:
        gateway.stop()
        upstream.stop()


if __name__ == "__main__":
    main()
