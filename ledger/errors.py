from core.errors import CapgateError
from core.money import format_usd


class BudgetExceeded(CapgateError):
    """A blocking ceiling has no room for the request's worst case. 402, never retried."""

    status = 402
    type = "budget_exceeded"

    def __init__(
        self, *, code: str, budget_id: int, window_id: int, limit_nano: int, remaining_nano: int, worst_nano: int
    ):
        super().__init__(
            # Exact to the nano-USD: the numbers that were compared, not a rounding of them.
            f"Refused by {code.replace('_', ' ')}: the request's worst case "
            f"{format_usd(worst_nano, exact=True)} exceeds the {format_usd(max(remaining_nano, 0), exact=True)} "
            f"remaining of {format_usd(limit_nano, exact=True)}.",
            code=code,
        )
        self.budget_id = budget_id
        self.window_id = window_id
        self.limit_nano = limit_nano
        self.remaining_nano = remaining_nano
        self.worst_nano = worst_nano


class BudgetUnavailable(CapgateError):
    """The database could not be reached at admission: fail closed."""

    status = 503
    code = "budget_unavailable"
    type = "budget_unavailable"


class SubjectGone(BudgetUnavailable):
    """Who the request is charged to (its project, member, key or end customer) was deleted while
    it was being admitted; nothing was reserved. The gateway resolves who pays again (an end
    customer named by header is created anew) and admits again; a deleted key is then refused."""
