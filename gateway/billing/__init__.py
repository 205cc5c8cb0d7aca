"""The billing inventory: every request field and forwarded header the gateway accepts, per
endpoint, in exactly one class (docs/billing.md). A field in no class is refused.

- free: cannot change the bill.
- tokens: bounded by tokens — covered by the byte bound on the input and the output ceiling.
- priced: priced per use — a catalog price and a count the request bounds.
- refused: refused under a blocking cap (402, code `<field>_under_budget`); allowed when only
  alert budgets apply.

A field, header, tool type or beta not listed here is refused with 400 under a blocking cap (an
unknown parameter can change what the provider bills in a way the bound cannot see), passed on
and counted where no blocking budget applies, and classifiable by the deployment's operator
without a release (gateway/admission/unclassified.py, catalog/classifications.py). The live endpoints' tables are in
`live.py`, the job endpoints' (files, batches, message batches, videos) in `jobs.py`; each
endpoint's allowlist is its table. `tests/gateway/test_billing_inventory.py` compares the tables
with the official SDKs' request types, so a new SDK parameter fails the suite until it is
classified, and checks that docs/billing.md is these tables.

Pure data and string functions, no Django: `python -m gateway.billing` prints docs/billing.md.
"""

from gateway.billing.docs import ENDPOINTS, counts, markdown
from gateway.billing.entries import CLASS_TITLES, FREE, IDENT, PRICED, REFUSED, TOKENS, Entry
from gateway.billing.jobs import JOB_ENDPOINTS, JOB_FIELDS, JOB_HEADERS_NOT_FORWARDED, VIDEO_PRICED_SIZES
from gateway.billing.kinds import KINDS
from gateway.billing.live import (
    ANTHROPIC_BETAS,
    CLIENT_HEADERS,
    FIELDS,
    HEADERS,
    NOT_FORWARDED,
    PROVIDER_HEADER_PREFIXES,
    TOOL_TYPES,
    client_header,
    undated,
)

__all__ = [
    "ANTHROPIC_BETAS",
    "CLASS_TITLES",
    "ENDPOINTS",
    "FIELDS",
    "FREE",
    "HEADERS",
    "IDENT",
    "JOB_ENDPOINTS",
    "JOB_FIELDS",
    "JOB_HEADERS_NOT_FORWARDED",
    "KINDS",
    "NOT_FORWARDED",
    "PRICED",
    "PROVIDER_HEADER_PREFIXES",
    "CLIENT_HEADERS",
    "client_header",
    "REFUSED",
    "TOKENS",
    "TOOL_TYPES",
    "VIDEO_PRICED_SIZES",
    "Entry",
    "counts",
    "markdown",
    "undated",
]
