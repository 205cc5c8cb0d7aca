"""POST /v1/files, GET/DELETE /v1/files/{id}, GET /v1/files/{id}/content.

An upload for purpose "batch" is a batch input file: every line is validated and bounded as the
live request would be (jobs/sizing.py) before anything is sent, and the file goes to the
connection its lines route to, with each line's model and output ceiling as capgate decided.
Output and error files of a batch are registered for its organization when the job reports
them (jobs/settle.py), so results are proxied to that organization only."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesParser
from urllib.parse import parse_qsl

import httpx
from django.conf import settings

from core.strict import ascii_int
from gateway import billing
from gateway.http.errors import GatewayError, bad_request
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import selectors, service, sizing, uploads
from jobs.http import endpoint, refuse_unlisted, upstream_failed
from jobs.upstream import loads, send
from tenants.models import ApiKey


def parse_multipart(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data fields: name -> (filename or None, bytes). A NUL in a field's name, a
    filename or a field that is not a file is refused (400): PostgreSQL text cannot hold one.

    Split on the boundary with bytes operations, and only each part's few header lines go through
    the email parser: the email parser over a whole body of 100 MiB takes seconds of CPU."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request("Upload the file as multipart/form-data (fields 'purpose' and 'file').")
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise bad_request("The multipart body could not be parsed.")
    parts = (b"\r\n" + raw).split(b"\r\n--" + boundary.encode("latin-1"))
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in parts[1:]:
        if part.startswith(b"--"):  # the close delimiter: what follows is the epilogue
            return fields
        head, found, payload = part.partition(b"\r\n\r\n")
        if not found:
            break
        headers = BytesParser(policy=policy.HTTP).parsebytes(head.lstrip(b" \t").removeprefix(b"\r\n") + b"\r\n\r\n")
        if headers.get("content-transfer-encoding", "").strip().lower() == "base64":
            payload = base64.b64decode(payload)
        name = headers.get_param("name", header="content-disposition")
        if isinstance(name, str):
            filename = headers.get_filename()
            if "\x00" in name or "\x00" in (filename or "") or (filename is None and b"\x00" in payload):
                raise bad_request("A form field holds a NUL character.", code="nul_character")
            fields[name] = (filename, payload)
    raise bad_request("The multipart body could not be parsed.")


@dataclass
class _Upload:
    filename: str | None
    expiry: dict[str, str]
    sized: sizing.SizedLines
    rewritten: bytes


def prepare_upload(*, key: ApiKey, content_type: str, raw: bytes, allowed: list[str], quota: int) -> _Upload:
    """An upload's form parsed, its file's lines sized and the organization's file quota checked:
    CPU work in proportion to the file, run in a sizing process (jobs/uploads.py), never on the
    gateway's event loop nor its threads, which serve every tenant's requests."""
    fields = parse_multipart(content_type, raw)
    refuse_unlisted("files", fields, form=True, allowed=allowed)
    purpose = (fields.get("purpose") or (None, b""))[1].decode("utf-8", "replace").strip()
    if "file" not in fields:
        raise bad_request("'file' is required.", param="file")
    if purpose != "batch":
        raise bad_request(
            "capgate accepts files for purpose 'batch' only (the input of /v1/batches).",
            param="purpose",
            code="unsupported_purpose",
        )
    filename, content = fields["file"]
    # expires_after (`expires_after[anchor]`, `expires_after[seconds]` as the SDK sends it) goes
    # to the provider as given; the other fields are capgate's to decide.
    expiry = {
        name: value.decode("utf-8", "replace")
        for name, (part_filename, value) in fields.items()
        if name.split("[", 1)[0] == "expires_after" and part_filename is None
    }
    sized, rewritten = sizing.size_openai_file(key=key, raw=content)
    uploads.check_room(organization_id=key.organization_id, adding=len(rewritten), quota=quota)
    sized.bodies = []  # in `rewritten` already: not copied back from the sizing process twice
    return _Upload(filename=filename, expiry=expiry, sized=sized, rewritten=rewritten)


@endpoint("openai")
async def upload(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    async with uploads.upload_slot(key.organization_id):
        # An organization already at its quota is refused before its body is read.
        quota = settings.CAPGATE["ORG_STORED_FILE_BYTES"]
        await runtime.db(uploads.check_room, organization_id=key.organization_id, adding=1, quota=quota)
        raw = await req.body(sizing.max_file_bytes())
        prepared = await uploads.sizing_turn(
            prepare_upload,
            key=key,
            content_type=req.headers.get("content-type", ""),
            raw=raw,
            allowed=list(billing.JOB_FIELDS["files"]),
            quota=quota,
        )
        await _send_upload(req, key, prepared)


async def _send_upload(req: Request, key: ApiKey, prepared: _Upload) -> None:
    sized, rewritten, filename, expiry = prepared.sized, prepared.rewritten, prepared.filename, prepared.expiry
    connection = sizing.batch_connection(sized, "openai")
    try:
        resp = await send(
            proxy.client(),
            connection,
            "POST",
            "/v1/files",
            data={"purpose": "batch", **expiry},
            files={"file": (filename or "batch.jsonl", rewritten, "application/jsonl")},
        )
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    data = loads(resp.content)
    if resp.status_code == 200 and isinstance(data, dict) and isinstance(data.get("id"), str):
        await runtime.db(
            service.keep_file,
            organization_id=key.organization_id,
            file_id=data["id"],
            connection_id=connection.id,
            purpose="batch",
            filename=(filename or "")[:255],
            size_bytes=len(rewritten),
            kind=sized.kind,
            route=sized.route[:200],
            model_id=sized.target.model.id,
            line_count=len(sized.bounds),
            line_bounds=sized.bounds,
            line_models=sized.line_models,
            refused_code=sized.refused_code,
            lane="settle",
        )
    await req.respond(resp.status_code, resp.content)


# OpenAI's GET /v1/files: `limit` 1 to 10,000 (default 10,000), `order` desc by default.
MAX_LIST_LIMIT = 10_000


@endpoint("openai")
async def list_files(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    """The organization's files, from capgate's own rows (no provider call): uploads and the
    batch output and error files registered for it."""
    query = dict(parse_qsl(req.scope.get("query_string", b"").decode("latin-1")))
    limit = ascii_int(query.get("limit", str(MAX_LIST_LIMIT)))
    if limit is None:
        raise bad_request("'limit' must be an integer.", param="limit")
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad_request(f"'limit' must be between 1 and {MAX_LIST_LIMIT}.", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'.", param="order")
    rows, has_more = await runtime.db(
        selectors.files_page,
        organization_id=key.organization_id,
        after=query.get("after"),
        limit=limit,
        order=order,
        purpose=query.get("purpose"),
    )
    data = [
        {
            "id": row.file_id,
            "object": "file",
            "bytes": row.size_bytes,
            "created_at": int(row.created_at.timestamp()),
            "filename": row.filename,
            "purpose": row.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        for row in rows
    ]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    await req.json(200, {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more})


async def _owned(key: ApiKey, file_id: str):
    row = await runtime.db(service.owned_file, organization_id=key.organization_id, file_id=file_id)
    if row is None or row.connection is None:
        raise service.not_found("file", file_id, "file_id")
    return row


@endpoint("openai")
async def retrieve(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    row = await _owned(key, match.group(1))
    await _proxy(req, row.connection, "GET", f"/v1/files/{row.file_id}")


@endpoint("openai")
async def content(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    row = await _owned(key, match.group(1))
    await _proxy(req, row.connection, "GET", f"/v1/files/{row.file_id}/content", raw=True)


@endpoint("openai")
async def delete(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    row = await _owned(key, match.group(1))
    status = await _proxy(req, row.connection, "DELETE", f"/v1/files/{row.file_id}")
    if status == 200:
        await runtime.db(service.forget_file, organization_id=key.organization_id, file_id=row.file_id, lane="settle")


async def _proxy(req: Request, connection, method: str, path: str, raw: bool = False) -> int:
    try:
        resp = await send(proxy.client(), connection, method, path)
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    content_type = resp.headers.get("content-type", "application/json").encode("latin-1")
    await req.respond(resp.status_code, resp.content, content_type=content_type if raw else b"application/json")
    return resp.status_code


__all__ = ["GatewayError", "content", "delete", "list_files", "parse_multipart", "retrieve", "upload"]
