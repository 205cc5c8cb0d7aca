"""Exact prompt counts: what a count costs, and what it frees in a burst on a blocking cap.

    bash scripts/services.sh start
    .venv/bin/python bench/prompt_counts.py             # ~8 minutes; prints three markdown tables
    .venv/bin/python bench/prompt_counts.py --cost-only # the first table only, no services

1. Counting cost vs body size: one chat user message of ASCII prose, CJK prose or Python code
   (bench/utilization.py's texts, repeated) of 1 KB to 1 MB, and a Codex-shaped Responses body
   (instructions, four tool definitions, a user message, a function call and its output) of
   10 KB to 1 MB. For each: the byte bound (what the gateway reserves without a count), the
   count (gateway/admission/tokens.py, o200k_base; a Responses body's tools and call keep their
   bytes), the time the count takes in this process (the best of 5 or more: the CPU it needs)
   and through the token counter process (gateway/admission/token_counter.py, started here on
   its own socket: the same count, plus the round trip and the texts sent), and the room the
   count frees at gpt-4o's input rate ($2.50 per 1M tokens), per millisecond
   of counting.
2. A burst: N requests (default 500) released at once on a fresh organization whose blocking
   cap is worth exactly 100 true calls: the fake upstream bills the prompt as o200k_base counts
   it (tests/upstream/chatml.py renders a Responses body as the provider does) and the reply at
   its full max_tokens (100), so a reservation fitted to the prompt is one true call. Chat: the
   gateway's rule (count every governed prompt up to CAPGATE_EXACT_COUNT_MAX_BYTES) and the old
   one (count only past CAPGATE_EXACT_COUNT_SHARE of the tightest room:
   CAPGATE_EXACT_COUNT_MAX_BYTES=0). Responses: a Codex turn of counted parts, counted today and
   bounded by bytes as it was before (CAPGATE_EXACT_COUNT_MAX_BYTES=0 with a share of 1: bytes
   until they would be refused), and a Codex turn with its tools (bytes). Slices off and on: what
   was admitted, how each admitted call's prompt was bounded, the recorded spend as a share of
   the cap (read from the window, after the drain), and the overshoot (spend above the cap;
   must be 0). The upstream answers after --delay-ms (default 20 s) so every admitted call is
   still in flight when the last request is sized: room is freed only by the count, not by a
   call ending.

It uses its own database (capgate_bench_counts), ports 28210-28211, and only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import PY, Proc, env, fresh_database, wait_http  # noqa: E402
from bench.utilization import PROMPTS  # noqa: E402 — ASCII, CJK and code texts
from core.money import nano_to_usd  # noqa: E402
from tests.upstream import chatml  # noqa: E402 — what the fake upstream bills

DB = "capgate_bench_counts"
UP_PORT, GW_PORT = 28211, 28210
PRICE_IN, PRICE_OUT = 2_500, 10_000  # nano-USD per token: gpt-4o's $2.50 / $10 per 1M
MAX_TOKENS = 100
CALLS = 100
ENCODING = "o200k_base"
# ~840 bytes of English prose: its byte bound holds the room of ~2.3 true calls.
BURST_TEXT = PROMPTS["ASCII"][:840]
# Responses before they were counted: bytes, counted only where bytes would be refused.
BYTES_ONLY = {"EXACT_COUNT_MAX_BYTES": "0", "EXACT_COUNT_SHARE": "1.0"}
MODES = [  # (label, endpoint, body, CAPGATE_* overrides, slices)
    ("count up to MAX_BYTES (today)", "chat", "chat", {}, False),
    ("count up to MAX_BYTES (today)", "chat", "chat", {}, True),
    ("count past 5 % of room only (old)", "chat", "chat", {"EXACT_COUNT_MAX_BYTES": "0"}, False),
    ("count past 5 % of room only (old)", "chat", "chat", {"EXACT_COUNT_MAX_BYTES": "0"}, True),
    ("count up to MAX_BYTES (today)", "responses", "codex turn", {}, False),
    ("count up to MAX_BYTES (today)", "responses", "codex turn", {}, True),
    ("bytes until refused (before)", "responses", "codex turn", BYTES_ONLY, False),
    ("bytes until refused (before)", "responses", "codex turn", BYTES_ONLY, True),
    ("count up to MAX_BYTES (today)", "responses", "codex turn + tools", {}, False),
    ("count up to MAX_BYTES (today)", "responses", "codex turn + tools", {}, True),
]
ENDPOINTS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
TOOLS = [  # Codex's kinds of client tools: a function, a namespace of MCP functions, a custom tool
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}, "description": "The command to run."},
                "workdir": {"type": "string", "description": "The working directory."},
                "timeout_ms": {"type": "number", "description": "The timeout in milliseconds."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Tools from the docs MCP server.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Searches the documentation.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            }
        ],
    },
    {"type": "custom", "name": "apply_patch", "description": "Applies a patch to files in the repository."},
]


def _text(base: str, size: int) -> str:
    text = base
    while len(text.encode()) < size:
        text += base
    return text.encode()[:size].decode(errors="ignore")


def codex_body(size: int, tools: bool = True) -> dict:
    """A Codex-shaped Responses turn of about `size` bytes: instructions (English, a third), a
    user message, a shell call, and its output (code, the rest), with Codex's kinds of tools."""
    body: dict = {
        "model": "counted",
        "instructions": _text(PROMPTS["ASCII"], size // 3),
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the tests."}]},
            {"type": "function_call", "name": "shell", "arguments": '{"command":["pytest","-q"]}', "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": _text(PROMPTS["code"], size - size // 3)},
            {"type": "message", "role": "user", "content": "Summarize the output."},
        ],
        "max_output_tokens": MAX_TOKENS,
        "store": False,
    }
    return {**body, "tools": TOOLS} if tools else body


def _timed(prompt, enc, runs: int) -> tuple[int, float]:
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from gateway.admission import tokens

    times = []
    for _ in range(runs):
        started = time.perf_counter()
        exact = tokens.count(prompt, enc)
        times.append((time.perf_counter() - started) * 1000)
    return exact, min(times)  # the CPU it takes: other work on a shared host only adds to it


def cost_table() -> list[str]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    # Imported after django.setup(): these import models, which need the app registry.
    from gateway.admission import token_counter, tokens
    from gateway.admission.bounds import shape_chat, shape_responses

    enc = tokens.encoding(ENCODING)
    if enc is None:
        raise SystemExit("o200k_base data missing: run scripts/bootstrap.sh")
    counter = _start_counter()
    remote = token_counter.Remote(counter[1], ENCODING)
    rows = [
        "| body | text | body KB | byte bound (tokens) | count | count µs (best of 5+) | through the counter µs "
        "| room freed $ (at $2.50/M) | room freed $ per count ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    shapes = [
        (
            "chat message",
            label,
            kb,
            shape_chat({"model": "m", "messages": [{"role": "user", "content": _text(base, kb * 1024)}]}),
        )
        for label, base in PROMPTS.items()
        for kb in (1, 10, 100, 1000)
    ] + [
        ("Responses, Codex turn", "ASCII + code, tools", kb, shape_responses(codex_body(kb * 1024)))
        for kb in (10, 40, 100, 1000)
    ]
    try:
        for body, label, kb, shape in shapes:
            assert shape.prompt is not None
            exact, ms = _timed(shape.prompt, enc, max(5, 100 // kb))
            same, remote_ms = _timed(shape.prompt, remote, max(5, 100 // kb))
            assert same == exact, (body, label, kb, same, exact)
            freed = nano_to_usd((shape.text_tokens - exact) * PRICE_IN)
            rows.append(
                f"| {body} | {label} | {kb} | {shape.text_tokens} | {exact} | {ms * 1000:.0f} | {remote_ms * 1000:.0f} "
                f"| {freed:.4f} | {freed / Decimal(ms):.3f} |"
            )
    finally:
        counter[0].terminate()
        counter[0].wait(30)
    return rows


def _start_counter() -> tuple[subprocess.Popen, str]:
    """The token counter on a socket of its own, once it answers."""
    sock = os.path.join(tempfile.mkdtemp(prefix="cg-bench-counts-", dir="/tmp"), "counter.sock")
    module = [PY, "-m", "gateway.admission.token_counter"]
    proc = subprocess.Popen([*module, "serve", "--socket", sock, "--preload", ENCODING], cwd=ROOT)
    deadline = time.monotonic() + 30
    while subprocess.run([*module, "check", "--socket", sock], cwd=ROOT, capture_output=True).returncode:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the token counter did not start")
        time.sleep(0.1)
    return proc, sock


def _setup(modes: int) -> list[tuple[str, int, int]]:
    """One organization per mode, each with its own key and a blocking cap worth CALLS true
    calls; returns (key, budget id, cap nano)."""
    fresh_database(DB)
    os.environ.update(env(DB))
    import django

    django.setup()
    # Imported after django.setup(): these import models, which need the app registry.
    from catalog.models import Connection, Model, Provider, Route, RouteTarget
    from ledger.models import Budget
    from tenants.models import ApiKey, Organization, Project, hash_key

    provider = Provider.objects.create(slug="openai", name="OpenAI")
    model = Model.objects.create(
        provider=provider,
        name="gpt-4o-counted",
        input_usd_per_mtok=Decimal(PRICE_IN) / 1000,
        output_usd_per_mtok=Decimal(PRICE_OUT) / 1000,
        max_output_tokens=16384,
        tokenizer=ENCODING,
    )
    out = []
    for i, (_, endpoint, name, _, _) in enumerate(MODES[:modes]):
        true_nano = _true_prompt(endpoint, name) * PRICE_IN + MAX_TOKENS * PRICE_OUT
        org = Organization.objects.create(name=f"Counts {i}", slug=f"counts-{i}")
        project = Project.objects.create(organization=org, name="Main", slug="main")
        key = f"cg_bench_counts_{i}_000000000000"
        ApiKey.objects.create(organization=org, project=project, name="k", prefix=f"cg_bc{i}", key_hash=hash_key(key))
        up = Connection.objects.create(
            organization=org, name="up", kind="openai", base_url=f"http://127.0.0.1:{UP_PORT}/v1"
        )
        RouteTarget.objects.create(
            route=Route.objects.create(organization=org, name="counted"), connection=up, model=model
        )
        cap = Budget.objects.create(
            organization=org, scope="organization", mode="block", period="month", amount_nano=CALLS * true_nano
        )
        out.append((key, cap.id, cap.amount_nano))
    return out


def _body(endpoint: str = "chat", name: str = "chat") -> dict:
    if endpoint == "responses":
        # ~13 KB: instructions, a user message, a call and its output; tools only where named
        return codex_body(13_000, tools=name.endswith("tools"))
    return {"model": "counted", "messages": [{"role": "user", "content": BURST_TEXT}], "max_tokens": MAX_TOKENS}


def _true_prompt(endpoint: str, name: str) -> int:
    if endpoint == "responses":
        return chatml.responses_prompt_tokens(_body(endpoint, name), ENCODING)
    return chatml.prompt_tokens(_body(endpoint, name), ENCODING)


async def _burst(key: str, n: int, endpoint: str, name: str) -> list[httpx.Response | BaseException]:
    url = f"http://127.0.0.1:{GW_PORT}{ENDPOINTS[endpoint]}"
    body = _body(endpoint, name)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        calls = [client.post(url, json=body, headers={"authorization": f"Bearer {key}"}) for _ in range(n)]
        return list(await asyncio.gather(*calls, return_exceptions=True))


def _settled(budget_id: int, timeout: float = 60.0) -> int:
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from ledger.models import Reservation, Window

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        window = Window.objects.filter(budget_id=budget_id).first()
        if window is not None and window.reserved_nano == 0 and not Reservation.objects.exists():
            return window.spent_nano
        time.sleep(0.1)
    raise RuntimeError(f"budget {budget_id} did not settle in {timeout} s")


def burst_table(n: int, delay_ms: int) -> list[str]:
    (ROOT / "var").mkdir(exist_ok=True)
    orgs = _setup(len(MODES))
    upstream = Proc("counts-upstream", [PY, "-m", "tests.upstream.server", "--port", str(UP_PORT)], db=DB)
    rows = [
        "| endpoint | body | rule | slices | requests | admitted | refused | other | admitted calls bounded by "
        "| spent / cap | overshoot $ | burst s |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    try:
        wait_http(f"http://127.0.0.1:{UP_PORT}/_stats")
        httpx.post(
            f"http://127.0.0.1:{UP_PORT}/_control",
            json={"delay_ms": delay_ms, "count_prompt": ENCODING, "completion_tokens": "max"},
        ).raise_for_status()
        for (label, endpoint, name, overrides, slices), (key, budget_id, cap) in zip(MODES, orgs, strict=True):
            os.environ["CAPGATE_SLICES"] = "true" if slices else "false"
            for knob in ("EXACT_COUNT_MAX_BYTES", "EXACT_COUNT_SHARE"):
                os.environ.pop(f"CAPGATE_{knob}", None)
            os.environ.update({f"CAPGATE_{k}": v for k, v in overrides.items()})
            gateway = Proc(
                "counts-gateway",
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
                wait_http(f"http://127.0.0.1:{GW_PORT}/v1/models", {"authorization": f"Bearer {key}"})
                time.sleep(2)  # the tokenizers load on a worker thread at startup
                started = time.monotonic()
                answers = asyncio.run(_burst(key, n, endpoint, name))
                took = time.monotonic() - started
                spent = _settled(budget_id)
            finally:
                gateway.stop()
            codes = Counter(a.status_code if isinstance(a, httpx.Response) else "error" for a in answers)
            bounds = Counter(_bounds(budget_id))
            other = n - codes[200] - codes[402]
            rows.append(
                f"| {ENDPOINTS[endpoint]} | {name} | {label} | {'on' if slices else 'off'} | {n} | "
                f"{codes[200]} | {codes[402]} | {other} | "
                f"{', '.join(f'{v} {k}' for k, v in sorted(bounds.items()))} | {spent / cap:.1%} | "
                f"{nano_to_usd(max(spent - cap, 0)):.6f} | {took:.1f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)  # progress
    finally:
        upstream.stop()
    return rows


def _shape(endpoint: str, name: str):
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from gateway.admission.bounds import shape_chat, shape_responses

    return (shape_responses if endpoint == "responses" else shape_chat)(_body(endpoint, name))


def _byte_bound(endpoint: str, name: str) -> int:
    return _shape(endpoint, name).text_tokens


def _counted(endpoint: str, name: str) -> int:
    """What the gateway reserves for the prompt: the count, with the fixed tool-use overhead."""
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from gateway.admission import tokens

    return tokens.count(_shape(endpoint, name).prompt, tokens.encoding(ENCODING))


def _bounds(budget_id: int) -> list[str]:
    """How each served call of the budget's organization had its prompt bounded."""
    # Imported here: this script sets Django up in main(), after this module is loaded.
    from ledger.models import Budget, UsageRecord

    org_id = Budget.objects.get(id=budget_id).organization_id
    return list(
        UsageRecord.objects.filter(organization_id=org_id, status="served").values_list("input_bound", flat=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost-only", action="store_true", help="print the counting-cost table only")
    parser.add_argument("--requests", type=int, default=500, help="requests in the burst (at most 1000)")
    parser.add_argument("--delay-ms", type=int, default=20_000, help="the fake upstream's response time")
    args = parser.parse_args()
    n = min(max(args.requests, 1), 1000)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# capgate exact prompt counts — {now}, {os.cpu_count()} cores\n")
    if args.cost_only:
        print("\n".join(cost_table()))
        return
    rows = burst_table(n, args.delay_ms)  # sets Django up on the bench's database first
    print(
        f"\nBurst of {n} on a blocking cap worth {CALLS} true calls (o200k_base prompt, {MAX_TOKENS}-token replies):\n"
    )
    for endpoint, name in dict.fromkeys((e, b) for _, e, b, _, _ in MODES):
        print(
            f"- {name}: {_true_prompt(endpoint, name)} prompt tokens billed, counted {_counted(endpoint, name)}, "
            f"byte bound {_byte_bound(endpoint, name)}"
        )
    print()
    print("\n".join(rows))
    print("\nCounting cost vs body size (o200k_base, this process):\n")
    print("\n".join(cost_table()))


if __name__ == "__main__":
    main()
