"""URL routing of the fake upstream's file and job endpoints (server.py asks ``route`` first
for any path its fixed ``ROUTES`` table does not hold)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from . import batches, files, media
from .jobs import JobStore

_ID = r"([A-Za-z0-9_\-]+)"
# (method, pattern, handler(store, ex, *ids))
TABLE: list[tuple[str, re.Pattern[str], Callable[..., Awaitable[None]]]] = [
    ("POST", re.compile(r"/v1/files"), lambda s, ex: files.create(s.files, ex)),
    ("GET", re.compile(r"/v1/files"), lambda s, ex: files.listing(s.files, ex)),
    ("GET", re.compile(rf"/v1/files/{_ID}"), lambda s, ex, i: files.retrieve(s.files, ex, i)),
    (
        "GET",
        re.compile(rf"/v1/files/{_ID}/content"),
        lambda s, ex, i: files.content(s.files, ex, i),
    ),
    ("DELETE", re.compile(rf"/v1/files/{_ID}"), lambda s, ex, i: files.delete(s.files, ex, i)),
    ("POST", re.compile(r"/v1/batches"), batches.create),
    ("GET", re.compile(r"/v1/batches"), batches.listing),
    ("GET", re.compile(rf"/v1/batches/{_ID}"), batches.retrieve),
    ("POST", re.compile(rf"/v1/batches/{_ID}/cancel"), batches.cancel),
    ("GET", re.compile(rf"/v1/responses/{_ID}"), media.retrieve_response),
    ("POST", re.compile(rf"/v1/responses/{_ID}/cancel"), media.cancel_response),
    ("DELETE", re.compile(rf"/v1/responses/{_ID}"), media.delete_response),
    ("POST", re.compile(r"/v1/videos"), media.create_video),
    ("GET", re.compile(r"/v1/videos"), media.list_videos),
    ("GET", re.compile(rf"/v1/videos/{_ID}"), media.retrieve_video),
    ("GET", re.compile(rf"/v1/videos/{_ID}/content"), media.video_content),
    ("DELETE", re.compile(rf"/v1/videos/{_ID}"), media.delete_video),
    ("POST", re.compile(r"/v1/messages/batches"), batches.create_messages),
    ("GET", re.compile(r"/v1/messages/batches"), batches.listing_messages),
    ("GET", re.compile(rf"/v1/messages/batches/{_ID}"), batches.retrieve_messages),
    ("POST", re.compile(rf"/v1/messages/batches/{_ID}/cancel"), batches.cancel_messages),
    ("GET", re.compile(rf"/v1/messages/batches/{_ID}/results"), batches.results_messages),
]


def route(store: JobStore, method: str, path: str) -> Callable[[Any], Awaitable[None]] | None:
    """The handler for a file or job endpoint, its path ids bound; None when there is none."""
    for verb, pattern, handler in TABLE:
        match = pattern.fullmatch(path)
        if verb == method and match:
            return partial(_call, handler, store, match.groups())
    return None


def _call(handler: Callable[..., Awaitable[None]], store: JobStore, ids: tuple[str, ...], ex: Any) -> Awaitable[None]:
    return handler(store, ex, *ids)
