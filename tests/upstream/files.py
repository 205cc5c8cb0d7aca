"""The fake upstream's OpenAI Files API: multipart uploads, retrieve, list, content, delete.

Files live in a ``FileStore`` owned by the app's ``JobStore`` (tests/upstream/jobs.py), which also
writes batch output and error files into it. Multipart bodies are parsed with the standard
library's email parser (no extra dependency); ``parse_multipart`` also serves ``POST /v1/videos``,
which the openai SDK sends as multipart.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

PURPOSES = {"assistants", "batch", "fine-tune", "vision", "user_data", "evals"}


class ApiError(Exception):
    """An error the endpoint answers in its provider's error shape (server.py renders it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_multipart(raw: bytes, content_type: str) -> tuple[dict[str, str], dict[str, tuple[str, bytes]]]:
    """(form fields, uploads as name -> (filename, bytes)); ValueError when malformed."""
    if "boundary=" not in content_type:
        raise ValueError("multipart body without a boundary")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + raw)
    if not message.is_multipart():
        raise ValueError("malformed multipart body")
    fields: dict[str, str] = {}
    uploads: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise ValueError("multipart part without a name")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            uploads[name] = (filename, data)
        else:
            fields[name] = data.decode("utf-8", "replace")
    return fields, uploads


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))
    deleted: bool = False
    expires_after: int | None = None  # seconds after created_at (expires_after[seconds])

    def obj(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None if self.expires_after is None else self.created_at + self.expires_after,
            "status_details": None,
        }


class FileStore:
    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}

    def add(self, filename: str, purpose: str, content: bytes, file_id: str | None = None) -> StoredFile:
        f = StoredFile(
            id=file_id or f"file-{uuid.uuid4().hex[:24]}",
            filename=filename,
            purpose=purpose,
            content=content,
        )
        self.files[f.id] = f
        return f

    def get(self, file_id: str) -> StoredFile:
        f = self.files.get(file_id)
        if f is None or f.deleted:
            raise ApiError(404, f"No such File object: {file_id}")
        return f


async def create(store: FileStore, ex: Any) -> None:
    purpose = ex.body.get("purpose")
    upload = ex.uploads.get("file")
    if upload is None:
        raise ApiError(400, "'file' is a required multipart field")
    if purpose not in PURPOSES:
        raise ApiError(400, f"'purpose' must be one of {sorted(PURPOSES)}")
    expires_after = None
    if "expires_after[seconds]" in ex.body:  # as the SDK sends expires_after, anchored at created_at
        if ex.body.get("expires_after[anchor]") != "created_at" or not str(ex.body["expires_after[seconds]"]).isdigit():
            raise ApiError(400, "expires_after must be {anchor: 'created_at', seconds: <int>}")
        expires_after = int(ex.body["expires_after[seconds]"])
    filename, content = upload
    f = store.add(filename, str(purpose), content)
    f.expires_after = expires_after
    await ex.json(200, f.obj())


async def retrieve(store: FileStore, ex: Any, file_id: str) -> None:
    await ex.json(200, store.get(file_id).obj())


async def listing(store: FileStore, ex: Any) -> None:
    data = [f.obj() for f in reversed(store.files.values()) if not f.deleted]
    purpose = ex.query.get("purpose")
    if purpose:
        data = [d for d in data if d["purpose"] == purpose]
    await ex.json(
        200,
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        },
    )


async def content(store: FileStore, ex: Any, file_id: str) -> None:
    data = store.get(file_id).content
    await ex.start(200, "application/octet-stream", (b"content-length", b"%d" % len(data)))
    await ex.body_chunk(data)


async def delete(store: FileStore, ex: Any, file_id: str) -> None:
    store.get(file_id).deleted = True
    await ex.json(200, {"id": file_id, "object": "file", "deleted": True})
