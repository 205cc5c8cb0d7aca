"""capcheck's jobs scenario: every request is an OpenAI batch (one line, the plan's chat body)
submitted through /v1/files and /v1/batches on the run's echo connection, all at once. Each
batch's worst case is admitted at submission and held by its job until beat's poll settles it
from echo's per-line usage; the four properties are then decided as for any run, and the books
check that every admitted batch became a job settled under the request that submitted it.

mixed-model-batch: every batch has two lines on the same echo connection, the plan's request on
the run's model and the same request on a model at MIXED_PRICE times its price. Beside the
four properties, the books check each batch was recorded at echo's bill — each line at its own
model's price — and never above what it reserved.

The poll belongs to the jobs app, below capcheck (jobs/capcheck.py). A run waits for it, bounded
by the plan's settle timeout."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import TYPE_CHECKING, Any

import httpx

from capcheck.scenario import CHAT, Build, Scenario
from catalog.models import Model, Route, RouteTarget
from jobs.capcheck import settle_organization

if TYPE_CHECKING:
    from capcheck.plan import Plan, Sent, Setup
    from ledger.models import UsageRecord


def _prepare(build: Build) -> dict[str, Any]:
    # The plan's numbers are per request: bill the batch line at the standard price.
    build.model.batch_multiplier = 1
    build.model.save(update_fields=["batch_multiplier"])
    return {}


def _send(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    asyncio.run(_burst(setup, plan, sent))
    settle_organization(setup.organization.id, plan.settle_timeout)


async def _burst(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    body = setup.body(stream=False)
    line = "\n".join(
        json.dumps({"custom_id": f"capcheck-{i}", "method": "POST", "url": CHAT, "body": {**body, "model": route}})
        for i, route in enumerate(setup.batch_routes or (setup.route,))
    )
    limits = httpx.Limits(max_connections=len(sent), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=plan.url, limits=limits, timeout=plan.request_timeout) as client:
        # The files are the setup, not the burst: uploaded two at a time, within an organization's
        # uploads at once (CAPGATE_ORG_CONCURRENT_UPLOADS, default 2), so none is refused with 429.
        turns = asyncio.Semaphore(2)

        async def upload(s: Sent) -> str:
            async with turns:
                resp = await client.post(
                    "/v1/files",
                    headers={"authorization": f"Bearer {setup.keys[s.key]}"},
                    data={"purpose": "batch"},
                    files={"file": ("capcheck.jsonl", io.BytesIO(line.encode()), "application/jsonl")},
                )
            return str(resp.json().get("id") or "") if resp.status_code == 200 else ""

        file_ids = await asyncio.gather(*(upload(s) for s in sent))
        start = asyncio.Event()

        async def submit(s: Sent, file_id: str) -> None:
            await start.wait()
            began = time.perf_counter()
            try:
                resp = await client.post(
                    "/v1/batches",
                    headers={"authorization": f"Bearer {setup.keys[s.key]}"},
                    json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
                )
                s.status = resp.status_code
                s.request_id = resp.headers.get("x-capgate-request-id", "")
                if resp.status_code != 200:
                    s.code = str((resp.json().get("error") or {}).get("code") or "")
            except (httpx.HTTPError, ValueError) as exc:
                s.error = f"{type(exc).__name__}: {exc}"[:300]
            s.latency_s = time.perf_counter() - began

        tasks = [asyncio.create_task(submit(s, f)) for s, f in zip(sent, file_ids, strict=True)]
        await asyncio.sleep(0)
        start.set()
        await asyncio.gather(*tasks)


def _books(setup: Setup, records: list[UsageRecord]) -> list[str]:
    """Every admitted batch's record is its job's: it carries the job id, it is not estimated
    (echo reports every job, so none should have lapsed to its worst case), and the job was
    billed within what its submission reserved (the cap's P1 counts excess as measured; for a
    job, any excess means its worst case was not admitted whole)."""
    problems = []
    for r in records:
        if not r.job_id:
            problems.append(f"P1: record {r.request_id} settles no job")
        elif r.status != "served":
            problems.append(f"P1: job {r.job_id} ended {r.status}, not settled from its report")
        elif r.excess_nano:
            problems.append(f"P1: job {r.job_id} billed {r.excess_nano} nano-USD over its reserved worst case")
    return problems


JOBS = Scenario(name="jobs", prepare=_prepare, send=_send, books=_books)

MIXED_PRICE = 3  # the second line's model costs this many times the run's model


def _prepare_mixed(build: Build) -> dict[str, Any]:
    _prepare(build)
    model = build.model
    assert model.input_usd_per_mtok is not None and model.output_usd_per_mtok is not None  # create_run prices it
    pricey = Model.objects.create(
        provider=model.provider,
        name=f"{model.name}-x{MIXED_PRICE}",
        input_usd_per_mtok=model.input_usd_per_mtok * MIXED_PRICE,
        output_usd_per_mtok=model.output_usd_per_mtok * MIXED_PRICE,
        batch_multiplier=1,
    )
    route = Route.objects.get(pk=build.route_id)
    other = Route.objects.create(organization=build.organization, name=f"{route.name}-x{MIXED_PRICE}")
    RouteTarget.objects.create(route=other, connection=build.echo, model=pricey, position=0)
    return {"batch_routes": (route.name, other.name)}


def _mixed_books(setup: Setup, records: list[UsageRecord]) -> list[str]:
    """`_books`, and each batch recorded at echo's bill: the first line at the plan's actual cost,
    the second at MIXED_PRICE times it (echo bills both lines the same tokens)."""
    problems = _books(setup, records)
    billed = setup.tokens.actual_nano * (1 + MIXED_PRICE)
    for r in records:
        if r.status == "served" and r.cost_nano != billed:
            problems.append(f"P1: batch {r.job_id} recorded {r.cost_nano} nano-USD; the provider billed {billed}")
    return problems


MIXED_BATCH = Scenario(name="mixed-model-batch", prepare=_prepare_mixed, send=_send, books=_mixed_books)
