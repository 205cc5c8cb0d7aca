"""The gateway's synchronous steps before a provider call: authenticate, route, resolve who
pays, size the worst case and admit it. Runs on the gateway's database threads
(gateway/upstream/runtime.py).

The proxy's `admit_call` (authenticate, route, resolve who pays, then
`admit`) and the reservation API (gateway/admission/reservations.py) both go through `admit`, which
gives an `Admission`: one place sizes a request (gateway/admission/sizing.py), applies the tenant's
limits, creates a run's budget with its first admission, and admits it in the ledger. The steps
live beside it by job: gateway/admission/routing.py (key and route lookups),
gateway/admission/subjects.py (who pays: customer and run budgets), gateway/admission/sizing.py
(pricing and the worst case).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import OperationalError

from core.errors import CapgateError
from gateway.admission import unclassified
from gateway.admission.bounds import Shape
from gateway.admission.limits import enforce_limits
from gateway.admission.routing import Target, authenticate, resolve_route
from gateway.admission.sizing import Sized, Translation, bound_tokens, size
from gateway.admission.subjects import Payer, founding, payer
from gateway.http.errors import GatewayError
from gateway.upstream import continuations
from ledger import admission as ledger_admission
from ledger import slices
from ledger.admission import AdmissionRequest
from ledger.budget_cache import budgets_for
from ledger.errors import AdmitAgain, SubjectGone
from ledger.models import Budget, Reservation
from tenants.models import ApiKey


@dataclass
class Admission:
    """An admitted request: its reservation, the targets it may be sent to, and what was sized."""

    reservation: Reservation
    targets: list[Target]
    worst_nano: int
    inject_max_output: int | None  # the output ceiling sent upstream, as reserved (None: none is sent)
    governed: bool  # False when unpriced traffic is allowed past blocking budgets
    budgets: list[Budget] = field(default_factory=list)
    remaining_nano: int | None = None  # the tightest ceiling's room after this reservation
    input_bound: str = "bytes"  # how the prompt was bounded: "exact" (its tokenizer) or "bytes"
    input_tokens: int = 0  # the prompt tokens reserved (per sampling pass, before images)
    unclassified: list[str] = field(default_factory=list)  # passed unlisted names (gateway/admission/unclassified.py)
    translated: bool = False  # a target of the other format may be tried (gateway/translate/)


def admit(
    *,
    payer: Payer,
    request_id: str,
    model: str,
    shape: Shape | None = None,
    targets: list[Target] | None = None,
    amount_nano: int | None = None,
    proxied: bool = True,
    owner_id: int | None = None,
    lease: timedelta | None = None,
    origin: str = Reservation.Origin.GATEWAY,
    sliced: bool = False,
    translation: Translation | None = None,
) -> Admission:
    """Size a request's worst case and admit it: the one way a request gets a reservation.

    The worst case is `amount_nano` when the caller states it (the reservation API's
    `amount_usd`), else sized from `shape` over `targets` (gateway/admission/sizing.py). A proxied request
    is held to the tenant's concurrency and rate limits first, so a limited one reserves nothing.
    A first call creates its new end customer, the customer's default cap and the run's budget
    in the same transaction as its admission (subjects.founding): a refused first call leaves
    none of them behind.
    `sliced`: the request may be admitted from this process's headroom slices (ledger/slices.py);
    only a proxied call that settles in this process (not a provider job) may.
    """
    deadline = time.monotonic() + ledger_admission.ADMIT_RETRY_SECONDS
    while True:
        try:
            with founding(payer) as who:
                return _admit(
                    payer=who,
                    request_id=request_id,
                    model=model,
                    shape=shape,
                    targets=targets or [],
                    amount_nano=amount_nano,
                    proxied=proxied,
                    owner_id=owner_id,
                    lease=lease,
                    origin=origin,
                    sliced=sliced,
                    translation=translation,
                )
        except AdmitAgain:
            # A first call's transaction rolled back (its budgets changed mid-admission): again,
            # from its first row, until ADMIT_RETRY_SECONDS, as an admission outside one retries.
            if time.monotonic() > deadline:
                raise
        except OperationalError as exc:
            # A first call's transaction chosen as a deadlock's victim (rolled back whole): again.
            if getattr(exc.__cause__, "sqlstate", None) != "40P01" or time.monotonic() > deadline:
                raise
        time.sleep(ledger_admission.RETRY_MAX_SLEEP)


def _admit(
    *,
    payer: Payer,
    request_id: str,
    model: str,
    shape: Shape | None,
    targets: list[Target],
    amount_nano: int | None,
    proxied: bool,
    owner_id: int | None,
    lease: timedelta | None,
    origin: str,
    sliced: bool,
    translation: Translation | None = None,
) -> Admission:
    budgets = budgets_for(payer.subject)
    if shape is None:  # the caller states its worst case
        assert amount_nano is not None
        sized = Sized(
            targets=targets,
            worst_nano=amount_nano,
            budgets=budgets,
            governed=any(b.mode == Budget.Mode.BLOCK for b in budgets),
        )
    else:
        # Only a proxied call is held to one turn at a time: the proxy releases the hold when it ends.
        turn = (
            _conversation_turn(payer=payer, shape=shape, budgets=budgets, request_id=request_id, owner_id=owner_id)
            if proxied
            else None
        )
        sized = size(
            key=payer.key, shape=shape, targets=targets, budgets=budgets, proxied=proxied, translation=translation
        )
        if proxied:  # the caller of the reservation API makes the call: its traffic is its own
            assert sized.shape is not None
            shapes = sized.bodies()
            if turn is not None:  # what the conversation may hold after this turn, before it is sent
                images = max((t.model.max_image_tokens or 0 for t in sized.targets), default=0)
                continuations.bound_turn(
                    organization_id=payer.key.organization_id,
                    conversation_id=turn,
                    request_id=request_id,
                    tokens=max(bound_tokens(s, sized.output_tokens) + s.images * images for s in shapes),
                )
            enforce_limits(
                key=payer.key,
                customer=payer.customer,
                targets=sized.targets,
                tokens=max(bound_tokens(s, sized.output_tokens) for s in shapes),
            )
    request = AdmissionRequest(
        subject=payer.subject,
        request_id=request_id,
        worst_nano=sized.worst_nano,
        model=model,
        owner_id=owner_id,
        budgets=sized.budgets,
        lease=lease,
        origin=origin,
    )
    admitted = slices.book.admit(request) if sliced else ledger_admission.admit(request=request)
    remaining = min((c.remaining_nano for c in admitted.ceilings), default=None)
    return Admission(
        reservation=admitted.reservation,
        targets=sized.targets,
        worst_nano=sized.worst_nano,
        inject_max_output=sized.inject_max_output,
        governed=sized.governed,
        budgets=sized.budgets,
        remaining_nano=remaining - sized.worst_nano if remaining is not None else None,
        input_bound=sized.input_bound,
        # Per sampling pass, before images; the larger of the bodies the targets are sent as.
        input_tokens=max((s.text_tokens for s in sized.bodies()), default=0),
        unclassified=unclassified.labels(sized.shape) if sized.shape else [],
        translated=bool(sized.translated),
    )


def admit_call(
    *,
    raw_key: str | None,
    shape: Shape | None,
    shape_error: CapgateError | None,
    kind: str,
    request_id: str,
    customer_id: str | None,
    run_id: str | None,
    run_budget_usd: str | None,
    owner_id: int | None,
    healthy: object,
    sliced: bool = True,
    translation: Translation | None = None,
) -> tuple[ApiKey, Admission]:
    """Everything before the provider call, in one trip to a database thread:
    authenticate, validate, route, resolve customer and run, admit.

    A subject deleted while the request was being admitted (an end customer, say) makes it
    resolve who pays again and admit again: an end customer named by header is created anew, as
    for any first sight, and a deleted key is refused by its authentication.
    With `translation` (the request in the other format, gateway/translate/), the route's
    targets of the other format may serve it too.
    """
    for attempt in range(SUBJECT_ATTEMPTS):
        key = authenticate(raw_key)
        if shape_error is not None:
            raise shape_error
        assert shape is not None
        targets = resolve_route(key=key, name=shape.model, kind=kind, translated=translation is not None)
        alive = [t for t in targets if healthy(t.connection.id)]  # type: ignore[operator]
        if not alive:
            raise GatewayError(
                f"Every connection serving '{shape.model}' is failing; retry later.",
                code="connection_unavailable",
                status=503,
            )
        who = payer(key=key, customer_id=customer_id, run_id=run_id, run_budget_usd=run_budget_usd)
        try:
            admission = admit(
                payer=who,
                request_id=request_id,
                model=shape.model,
                shape=shape,
                targets=alive,
                owner_id=owner_id,
                sliced=sliced,
                translation=translation,
            )
        except SubjectGone:
            if attempt + 1 == SUBJECT_ATTEMPTS:
                raise
            continue
        return key, admission
    raise AssertionError("unreachable")


def _conversation_turn(
    *, payer: Payer, shape: Shape, budgets: list[Budget], request_id: str, owner_id: int | None
) -> str | None:
    """Under a blocking budget, hold a Responses conversation for this turn before its stored
    context is read (gateway/upstream/continuations.py); the conversation id, or None."""
    ref = shape.context_ref
    if ref is None or ref[0] != "conversation" or not any(b.mode == Budget.Mode.BLOCK for b in budgets):
        return None
    continuations.claim_turn(
        organization_id=payer.key.organization_id, conversation_id=ref[1], request_id=request_id, owner_id=owner_id
    )
    return ref[1]


# A subject deleted mid-admission is resolved again this many times in all (each deletion is one
# administrative action; three in a row for one request is an operator deleting in a loop).
SUBJECT_ATTEMPTS = 3


# gateway/upstream/proxy.py imports these from here.
__all__ = ["Admission", "Target", "admit", "admit_call", "authenticate"]
