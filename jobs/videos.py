"""OpenAI video generation: POST /v1/videos, GET /v1/videos/{id}, GET .../content, DELETE.

A video is billed per second of output: its worst case is the requested seconds (4 when
absent) times the catalog's per-second price of the route's model (Model.video_usd_per_second),
reserved before the provider sees it; it is settled from the seconds of the completed video.
That price is for the sizes in gateway/billing/jobs.py VIDEO_PRICED_SIZES: a larger size is
refused under a blocking cap. The fields accepted are the inventory's (JOB_FIELDS["videos"])."""

from __future__ import annotations

import re

import httpx
from django.conf import settings

from catalog.pricing import UnpricedFeature, video_nano
from gateway import billing
from gateway.admission.bounds import parse_json
from gateway.admission.routing import Target, resolve_route
from gateway.http.errors import bad_request
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import service
from jobs.files import parse_multipart
from jobs.http import endpoint, refuse_unlisted, upstream_failed
from jobs.models import Job
from jobs.submit import Submission, submit
from jobs.upstream import send
from tenants.models import ApiKey

SECONDS = {"4": 4, "8": 8, "12": 12}
DEFAULT_SECONDS = "4"


def size_video(*, key: ApiKey, model: str, seconds: int, size: str | None) -> tuple[Target, int, str]:
    """(target, worst case, refusal code under a blocking cap). The catalog holds one price per
    second per model, for the sizes in billing.VIDEO_PRICED_SIZES; a larger size bills more per
    second than that price bounds, so a blocking cap refuses it (docs/billing.md, /v1/videos)."""
    target = resolve_route(key=key, name=model, kind="videos")[0]
    try:
        worst, refused = video_nano(model=target.model, seconds=seconds, worst=True), ""
    except UnpricedFeature:
        worst, refused = 0, "video_under_budget"
    if size is not None and size not in billing.VIDEO_PRICED_SIZES:  # absent: the provider's default
        refused = refused or "size_under_budget"
    return target, worst, refused


@endpoint("openai")
async def create(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    raw = await req.body(settings.CAPGATE["MAX_BODY_BYTES"])
    files: dict = {}
    multipart = req.headers.get("content-type", "").lower().startswith("multipart/form-data")
    if multipart:
        parts = parse_multipart(req.headers["content-type"], raw)
        fields = {k: v.decode("utf-8", "replace") for k, (name, v) in parts.items() if name is None}
        files = {k: (name, v) for k, (name, v) in parts.items() if name is not None}
    else:
        fields = {k: v for k, v in parse_json(raw).items()}
    refuse_unlisted("videos", [*fields, *files], form=multipart)
    if any(k.split("[", 1)[0] == "input_reference" for k in fields):
        raise bad_request(
            "'input_reference' must be an uploaded image (a multipart file part); capgate forwards no "
            "reference by file_id or image_url.",
            param="input_reference",
        )
    model, prompt = fields.get("model"), fields.get("prompt")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required.", param="model")
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("'prompt' is required.", param="prompt")
    seconds = str(fields.get("seconds") or DEFAULT_SECONDS)
    if seconds not in SECONDS:
        raise bad_request(f"'seconds' must be one of {sorted(SECONDS, key=int)}.", param="seconds")
    size = None if fields.get("size") is None else str(fields["size"])
    target, worst, refused = await runtime.db(size_video, key=key, model=model, seconds=SECONDS[seconds], size=size)
    form = {**{k: str(v) for k, v in fields.items()}, "model": target.model.name, "seconds": seconds}
    await submit(
        req,
        key,
        Submission(
            kind=Job.Kind.VIDEO,
            worst_nano=worst,
            route=model,
            refused_code=refused,
            connection=target.connection,
            model_id=target.model.id,
            path="/v1/videos",
            body=None,
            form=form,
            files=files,
            detail={"seconds": SECONDS[seconds]},
        ),
    )


async def _owned(key: ApiKey, video_id: str) -> Job:
    job = await runtime.db(
        service.owned_job, organization_id=key.organization_id, kind=Job.Kind.VIDEO, provider_job_id=video_id
    )
    if job is None or job.connection is None:
        raise service.not_found("video", video_id, "video_id")
    return job


async def _relay(req: Request, job: Job, method: str, suffix: str = "", raw: bool = False) -> None:
    path = f"/v1/videos/{job.provider_job_id}{suffix}"
    if raw and req.scope.get("query_string"):
        path += "?" + req.scope["query_string"].decode("latin-1")
    try:
        resp = await send(proxy.client(), job.connection, method, path)
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    ctype = resp.headers.get("content-type", "application/json").encode("latin-1") if raw else b"application/json"
    await req.respond(resp.status_code, resp.content, content_type=ctype)


@endpoint("openai")
async def retrieve(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    await _relay(req, await _owned(key, match.group(1)), "GET")


@endpoint("openai")
async def content(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    await _relay(req, await _owned(key, match.group(1)), "GET", "/content", raw=True)


@endpoint("openai")
async def delete(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    """Deleting a video the provider still counts does not end its hold: the poll settles it."""
    await _relay(req, await _owned(key, match.group(1)), "DELETE")
