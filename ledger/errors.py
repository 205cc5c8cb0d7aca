from core.errors import CapgateError
from core.money import format_usd, format_usd_brief


class BudgetExceeded(CapgateError):
    """A blocking ceiling has no room for the request's worst case. 402, never retried."""

    status = 402
    type = "budget_exceeded"

    def __init__(
        self, *, code: str, budget_id: int, window_id: int, limit_nano: int, remaining_nano: int, worst_nano: int
    ):
        super().__init__(
            # In dollars a person reads: the worst case rounded up and the remaining down, so they
            # compare as the exact figures did; those (nano-USD) are in the 402's headers.
            f"Refused by {code.replace('_', ' ')}: the request's worst case "
            f"{format_usd_brief(worst_nano, up=True)} exceeds the {format_usd_brief(max(remaining_nano, 0))} "
            f"remaining of {format_usd(limit_nano)}.",
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


class AdmitAgain(BudgetUnavailable):
    """An admission inside a caller's transaction found its budgets changed after its statement
    locked their windows. Reading them again there would create windows (a lock on the whole
    reservations table) while holding those row locks: the order a concurrent transaction takes
    the other way round, a deadlock. The caller rolls its transaction back and admits again."""
