"""The job endpoints' own request fields: /v1/files, /v1/batches, /v1/messages/batches and
/v1/videos. Each endpoint accepts exactly these (jobs/http.py `refuse_unlisted`); anything else
is refused with 400. The requests inside a job — batch file lines, message-batch params — are
classified by the live tables (gateway/billing/live.py) and shaped, bounded and refused as the
live request would be (jobs/sizing.py). Background responses are POST /v1/responses
(`background` in the live table)."""

from __future__ import annotations

from gateway.billing.entries import FREE, IDENT, PRICED, REFUSED, TOKENS, Entry

_e = Entry

JOB_ENDPOINTS = {
    "files": "/v1/files",
    "batches": "/v1/batches",
    "message_batches": "/v1/messages/batches",
    "videos": "/v1/videos",
}

# The sizes the catalog's one per-second video price is for (Model.video_usd_per_second); the
# provider's default, 720x1280, is one of them.
VIDEO_PRICED_SIZES = ("720x1280", "1280x720")

_STORED = "when the provider deletes the file; storing files is not billed"

JOB_FIELDS: dict[str, dict[str, Entry]] = {
    "files": {
        "file": _e(
            TOKENS,
            "a batch input file: each line is shaped, routed and bounded like the live request it makes, at "
            "the batch price; nothing is reserved until a batch names the file",
        ),
        "purpose": _e(
            FREE,
            "'batch' only (the input of /v1/batches); any other purpose is refused with 400 (`unsupported_purpose`)",
        ),
        "expires_after": _e(FREE, _STORED),
    },
    "batches": {
        "input_file_id": _e(
            TOKENS,
            "reserves the sum of the file's line bounds at the batch price; a file with a line a blocking cap "
            "would refuse live (e.g. `web_search_options`) is refused under a blocking cap with that line's code",
        ),
        "endpoint": _e(
            FREE,
            "the endpoint the file's lines call: /v1/chat/completions, /v1/responses or /v1/embeddings",
        ),
        "completion_window": _e(FREE, "'24h' only, the window the batch price is for"),
        "metadata": _e(FREE, IDENT),
        "output_expires_after": _e(FREE, _STORED),
    },
    "message_batches": {
        "requests": _e(
            TOKENS,
            "each request's params are shaped, routed and bounded like POST /v1/messages, at the batch price; "
            "a request a blocking cap would refuse live (e.g. `container`) is refused under a blocking cap "
            "with its code",
        ),
    },
    "videos": {
        "model": _e(
            PRICED,
            "the route's first target and its per-second video price; a model without one is refused under "
            "a blocking cap (`video_under_budget`)",
        ),
        "seconds": _e(PRICED, "4, 8 or 12 (4 when absent): the worst case is seconds x the per-second price"),
        "size": _e(
            REFUSED,
            "the catalog holds one per-second price per model, for "
            + " and ".join(VIDEO_PRICED_SIZES)
            + " (also when absent); the provider bills larger sizes more per second",
        ),
        "prompt": _e(FREE, "a video is billed per second of output, not by its prompt"),
        "input_reference": _e(
            FREE,
            "an uploaded first-frame image; the video is billed per second all the same. A reference "
            "object (file_id, image_url) is refused with 400: capgate forwards uploads only",
        ),
    },
}

# Job endpoints forward no client header: each call to the provider carries the connection's
# own headers, so no header can change what a job bills. The headers the official SDKs can send
# to them, and what that means:
JOB_HEADERS_NOT_FORWARDED: dict[str, dict[str, str]] = {
    "files": {},
    "batches": {},
    "message_batches": {
        "anthropic-version": "capgate's own wire-format version is sent",
        "anthropic-beta": "the requests are bounded without betas, so none is sent",
        "anthropic-user-profile-id": "not sent: the batch is attributed to the connection's account",
        "anthropic-workspace-id": "not sent: the connection's own account and workspace are billed",
    },
    "videos": {},
}
