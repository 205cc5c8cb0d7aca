"""docs/billing.md, generated from the inventory's tables (`python -m gateway.billing`)."""

from __future__ import annotations

from gateway.billing.entries import CLASS_TITLES, Entry
from gateway.billing.jobs import JOB_ENDPOINTS, JOB_FIELDS, JOB_HEADERS_NOT_FORWARDED
from gateway.billing.kinds import KINDS
from gateway.billing.live import ANTHROPIC_BETAS, CLIENT_HEADERS, FIELDS, HEADERS, NOT_FORWARDED, TOOL_TYPES
from gateway.billing.translation import markdown as translation_markdown

ENDPOINTS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "compact": "/v1/responses/compact",
    "embeddings": "/v1/embeddings",
    **JOB_ENDPOINTS,
}


def counts() -> dict[str, dict[str, int]]:
    """Fields and forwarded headers per class, per endpoint, live and job (for the docs)."""
    out: dict[str, dict[str, int]] = {}
    tables = [(kind, [*fields.values(), *HEADERS[kind].values()]) for kind, fields in FIELDS.items()]
    tables += [(kind, list(fields.values())) for kind, fields in JOB_FIELDS.items()]
    for kind, entries in tables:
        c = dict.fromkeys(CLASS_TITLES, 0)
        for entry in entries:
            c[entry.cls] += 1
        out[kind] = c
    return out


def _rows(head: str, table: dict[str, Entry]) -> list[str]:
    return [f"| {head} | class | why |", "|---|---|---|"] + [
        f"| `{name}` | {CLASS_TITLES[e.cls]} | {e.why} |" for name, e in table.items()
    ]


def markdown() -> str:
    """docs/billing.md."""
    lines = [
        "# Billing inventory",
        "",
        "Generated from `gateway/billing/` by `python -m gateway.billing > docs/billing.md`; a test",
        "fails when the two differ. Every request field and forwarded header the gateway accepts has",
        "exactly one class:",
        "",
        "- **free**: cannot change the bill.",
        "- **bounded by tokens**: covered by the byte bound on the input and the output ceiling.",
        "- **priced per use**: a catalog price and a count the request bounds.",
        "- **refused under a blocking cap**: 402 with code `<field>_under_budget`; allowed when only",
        "  alert budgets apply.",
        "",
        "Anything not listed is refused with 400 under a blocking cap (`unsupported_parameter`,",
        "`unsupported_header`, `unsupported_tool`, `unsupported_beta`, the message naming where to classify",
        "it). With no blocking budget on the request it is passed on (an unlisted header is never",
        "forwarded), counted in `capgate_unclassified_total{endpoint,name}` and noted on the request's usage",
        "record (`unclassified: field:name`). The deployment's operator classifies what is not listed",
        "(free, bounded by tokens, or refused under a blocking cap), for the deployment or one organization,",
        "with `POST /api/classifications/` (staff only) or `classifications:` in a `manage.py apply` file;",
        "the gateway reads it on the next request; each change is audited.",
        "",
        "The actual cost is read from every usage field the",
        "provider reports: tokens, cache reads, 5-minute and 1-hour cache writes,",
        "`server_tool_use.web_search_requests`, and the `service_tier` that served the request. A usage",
        "field that signals a paid feature capgate cannot price (audio tokens, an unknown tier, an",
        "unknown server tool) is charged at no less than the reserved worst case and flagged in the",
        "usage record's note, never dropped.",
        "",
        "## Counts",
        "",
        "| endpoint | " + " | ".join(CLASS_TITLES.values()) + " |",
        "|---|" + "---:|" * len(CLASS_TITLES),
    ]
    for kind, c in counts().items():
        lines.append(f"| {ENDPOINTS[kind]} | " + " | ".join(str(c[k]) for k in CLASS_TITLES) + " |")
    for kind, fields in FIELDS.items():
        lines += ["", f"## {ENDPOINTS[kind]}", "", *_rows("field", fields)]
        if HEADERS[kind]:
            lines += ["", "Forwarded headers:", "", *_rows("header", HEADERS[kind])]
        if kind in TOOL_TYPES:
            lines += ["", "Tool types:", "", *_rows("type", TOOL_TYPES[kind])]
    lines += [
        "",
        "## Provider headers that are not forwarded",
        "",
        "Any other `anthropic-*` or `openai-*` request header is refused with 400 (`unsupported_header`).",
        "",
        "| header | why it cannot change the bill |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {why} |" for name, why in NOT_FORWARDED.items()]
    lines += [
        "",
        "Other headers the SDKs, Claude Code and Codex send stay at the gateway too (a name ending in",
        "`-` is a prefix; `tests/clients/test_client_headers.py` captures them from the real clients):",
        "",
        "| header | why it cannot change the bill |",
        "|---|---|",
    ]
    lines += [f"| `{name}{'*' if name.endswith('-') else ''}` | {why} |" for name, why in CLIENT_HEADERS.items()]
    lines += ["", "## `anthropic-beta` values", "", *_rows("beta", ANTHROPIC_BETAS)]
    lines += translation_markdown()
    lines += [
        "",
        "## Connection kinds",
        "",
        "Each kind serves the endpoints above in its provider's format; what it adds to the bill:",
    ]
    groups: dict[int, list[str]] = {}  # kinds sharing one table (the presets) are listed once
    for kind, features in KINDS.items():
        groups.setdefault(id(features), []).append(kind)
    for kinds in groups.values():
        title = ", ".join(f"`{k}`" for k in kinds)
        lines += ["", f"### {title}", "", *_rows("feature", KINDS[kinds[0]])]
    lines += [
        "",
        "## Job endpoints",
        "",
        "A job is admitted once, at submission, for its whole worst case, and refused there (402, in",
        "the endpoint's own shape, before the provider sees it) when a blocking cap cannot admit it;",
        "its hold stays counted until the provider's final report. The requests inside a job (batch",
        "file lines, message-batch params) are classified by the live tables above and bounded at the",
        "batch price; a background response is POST /v1/responses with `background`. The job",
        "endpoints' own fields are below; any other field is refused with 400 (`unsupported_parameter`).",
    ]
    for kind, fields in JOB_FIELDS.items():
        lines += ["", f"### {ENDPOINTS[kind]}", "", *_rows("field", fields)]
        if JOB_HEADERS_NOT_FORWARDED[kind]:
            lines += [
                "",
                "No request header is forwarded (the connection's own are sent); the official SDK can send:",
                "",
                "| header | why it cannot change the bill |",
                "|---|---|",
            ]
            lines += [f"| `{name}` | {why} |" for name, why in JOB_HEADERS_NOT_FORWARDED[kind].items()]
    return "\n".join(lines) + "\n"
