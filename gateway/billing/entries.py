"""The classes of the billing inventory and one classified entry."""

from __future__ import annotations

from dataclasses import dataclass

FREE, TOKENS, PRICED, REFUSED = "free", "tokens", "priced", "refused"
CLASS_TITLES = {
    FREE: "free",
    TOKENS: "bounded by tokens",
    PRICED: "priced per use",
    REFUSED: "refused under a blocking cap",
}

IDENT = "an identifier or label; does not change what is billed"


@dataclass(frozen=True)
class Entry:
    cls: str
    why: str
