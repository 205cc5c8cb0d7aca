"""The per-process caches emptied by notices (core/invalidation.py): the budget cache's rule
(ledger/budget_cache.py) — no request that arrives after a budget edit returned is admitted
against the budgets from before it — and the lookup cache's notices (gateway/admission/routing.py).

Each test runs the gateway's own listener (gateway/upstream/runtime.py `Background._listen`) on
an event loop in a thread, on its own connection to the test database, and writes through
budgets.services or the ORM, whose triggers send the notices when they commit. A listener that
is *behind* (stuck, GIL-starved) is one whose notices are queued and not handled: its fences stop
coming back, so its lease runs out.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.utils import timezone

from budgets import services as budget_services
from budgets.services import update_budget
from core import invalidation
from gateway.admission import routing
from gateway.http.errors import GatewayError
from gateway.upstream import runtime
from ledger import budget_cache
from ledger.admission import AdmissionRequest, matching_budgets
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.slices import Book
from tenants.audit import Actor
from tenants.models import ApiKey
from tests.conftest import usd

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slices_on", "db_threads"),
]

WORST = usd("0.01")
LEASE = 1.0
ADMIN = Actor(label="test admin")
_ids = itertools.count()


@dataclass
class Listener:
    background: runtime.Background
    loop: asyncio.AbstractEventLoop
    queued: list[str]

    def fall_behind(self, monkeypatch) -> None:
        """From now on notices (and fences) wait unhandled, as in a listener stuck behind."""
        monkeypatch.setattr(invalidation.freshness, "on_notification", self.queued.append)


def _caught_up() -> None:
    """Wait until every notice committed before now has been handled (a fence sent after it came back)."""
    now = time.monotonic()
    _wait_for(lambda: (invalidation.freshness._heard_sent_at or 0) > now)


def _wait_for(condition, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def listener(settings) -> Iterator[Listener]:
    settings.CAPGATE = {**settings.CAPGATE, "CACHE_NOTIFY": True, "CACHE_LEASE_SECONDS": LEASE}
    background = runtime.Background()
    background.instance_id = register().id  # alive: budget edits wait out the lease
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> asyncio.Task:
        return asyncio.create_task(background._listen())

    async def stop(task: asyncio.Task) -> None:
        task.cancel()  # the listener closes its connection as it ends: wait for that, on its loop
        await asyncio.gather(task, return_exceptions=True)

    task = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=5)
    _wait_for(invalidation.freshness.current)
    yield Listener(background=background, loop=loop, queued=[])
    asyncio.run_coroutine_threadsafe(stop(task), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()
    invalidation.freshness.lost()
    invalidation.freshness.enabled = False


def _request(tenant, owner_id: int, budgets) -> AdmissionRequest:
    return tenant.request(f"req-{next(_ids)}", worst_nano=WORST, owner_id=owner_id, budgets=budgets)


def _sliced(acme, book: Book, owner: int):
    """A slice taken (window reserved 21 worst cases), then the budgets cached: the key the
    cached budgets give is the slice's."""
    budgets = matching_budgets(acme.subject())
    book.admit(_request(acme, owner, budgets))  # alone: sizes the next slice
    book.admit(_request(acme, owner, budgets))  # takes a slice of 20
    _caught_up()  # the budget's and its window's notices handled, so none empties what is cached next
    budget_cache.budgets_for(acme.subject())
    hits = budget_cache.cache.hits
    assert [b.amount_nano for b in budget_cache.budgets_for(acme.subject())] == [b.amount_nano for b in budgets]
    assert budget_cache.cache.hits == hits + 1  # served from the cache


def _lower(budget) -> float:
    """Lower the cap to one worst case, below the two requests in flight, through the service
    (what the slice holds unused does not count: a refusal that it would cover waits for it to be
    given back, ledger/slices.py); how long the edit took."""
    started = time.monotonic()
    update_budget(budget=budget, actor=ADMIN, amount_nano=WORST)
    return time.monotonic() - started


def _admitted_after_the_edit(acme, book: Book, owner: int) -> bool:
    try:
        book.admit(_request(acme, owner, budget_cache.budgets_for(acme.subject())))
    except BudgetExceeded:
        return False
    return True


@pytest.mark.parametrize("guard", [True, False], ids=["notice-empties", "notice-ignored (removal)"])
def test_an_edit_empties_the_cache_so_the_next_request_sees_the_lowered_amount(acme, listener, monkeypatch, guard):
    # given: a $10 cap, its budgets cached, a slice of 20 worst cases taken under them
    monkeypatch.setattr(budget_cache.GUARDS, "invalidate_on_notice", guard)
    budget = acme.budget(amount="10")
    owner, book = register().id, Book()
    _sliced(acme, book, owner)
    # when: an admin lowers the cap to one worst case (two requests are in flight)
    _lower(budget)
    # then: the next request reads the new amount, takes no slice of the old one, and is refused;
    # without the notice's effect the cached budgets still name $10 and the old slice admits it
    assert _admitted_after_the_edit(acme, book, owner) is not guard


def test_with_slices_off_even_a_stale_cache_admits_nothing_against_a_lowered_amount(
    acme, listener, monkeypatch, settings
):
    # given: slices off, the budgets cached, two requests in flight; the listener falls behind and
    # the lease is ignored, so the cache stays stale after the edit
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": False}
    monkeypatch.setattr(budget_cache.GUARDS, "trust_only_while_current", False)
    budget = acme.budget(amount="10")
    owner, book = register().id, Book()
    _caught_up()
    for _ in range(2):
        book.admit(_request(acme, owner, budget_cache.budgets_for(acme.subject())))
    listener.fall_behind(monkeypatch)
    _lower(budget)
    assert budget_cache.budgets_for(acme.subject())[0].amount_nano == usd("10")  # stale
    # then: the admission statement reads the amount under the window lock and refuses
    assert not _admitted_after_the_edit(acme, book, owner)


@pytest.mark.parametrize("guard", [True, False], ids=["lease-honoured", "lease-ignored (removal)"])
def test_a_listener_behind_stops_trusting_its_cache_once_the_lease_ran_out(acme, listener, monkeypatch, guard):
    monkeypatch.setattr(budget_cache.GUARDS, "trust_only_while_current", guard)
    budget = acme.budget(amount="10")
    owner, book = register().id, Book()
    _sliced(acme, book, owner)
    # when: the listener falls behind (the edit's notice will not be handled), and the edit
    # returns after the lease
    listener.fall_behind(monkeypatch)
    assert _lower(budget) >= LEASE
    # then: the process is no longer current and reads its budgets: refused at the new amount;
    # trusting the stale cache admits against $10
    assert not invalidation.freshness.current()
    assert _admitted_after_the_edit(acme, book, owner) is not guard
    assert any(p.startswith("budgets:") for p in listener.queued)  # the notice was sent, only late


@pytest.mark.parametrize("guard", [True, False], ids=["edit-waits", "edit-returns-at-once (removal)"])
def test_an_edit_returns_only_once_the_lease_has_passed(acme, listener, monkeypatch, guard):
    monkeypatch.setattr(budget_services.GUARDS, "wait_out_cache_lease", guard)
    budget = acme.budget(amount="10")
    owner, book = register().id, Book()
    _sliced(acme, book, owner)
    listener.fall_behind(monkeypatch)
    took = _lower(budget)
    # then: waited, the request after it is refused; returning at once, the process is still
    # within the lease of its last fence and admits against the amount that was lowered
    assert (took >= LEASE) is guard
    assert _admitted_after_the_edit(acme, book, owner) is not guard


def test_an_edit_waits_only_while_a_caching_gateway_process_is_alive(acme, settings):
    settings.CAPGATE = {**settings.CAPGATE, "CACHE_NOTIFY": True, "CACHE_LEASE_SECONDS": LEASE}
    budget = acme.budget(amount="10")
    assert _lower(budget) < LEASE  # no process registered: no cache to wait out
    register()
    assert _lower(budget) >= LEASE
    settings.CAPGATE = {**settings.CAPGATE, "CACHE_NOTIFY": False}
    assert _lower(budget) < LEASE  # the deployment caches no budgets


def test_a_read_that_began_before_a_write_is_not_kept_after_its_notice(acme, listener, monkeypatch):
    # given: a read of the budgets that is slow to return, racing an edit that commits and whose
    # notice is handled before the read is stored
    budget = acme.budget(amount="10")
    generation = budget_cache.cache._generations.get(acme.org.id, 0)
    real = budget_cache.matching_budgets

    def slow_read(subject):
        read = real(subject)
        _wait_for(lambda: budget_cache.cache._generations.get(acme.org.id, 0) > generation)
        return read

    monkeypatch.setattr(budget_cache, "matching_budgets", slow_read)
    reader = threading.Thread(target=lambda: budget_cache.budgets_for(acme.subject()))
    reader.start()
    time.sleep(0.1)
    _lower(budget)
    reader.join(timeout=5)
    monkeypatch.setattr(budget_cache, "matching_budgets", real)
    # then: the read's $10 was not kept; the next read is the database's one worst case
    assert budget_cache.budgets_for(acme.subject())[0].amount_nano == WORST


def test_a_dropped_connection_empties_every_cache(acme, listener):
    # given: the key and the budgets cached (again, if another write's notice emptied them)
    raw = _raw_key(acme)
    _wait_for(
        lambda: (
            routing.authenticate(raw) is not None
            and routing.lookups.get(("key", acme.key.key_hash)) is not None
            and budget_cache.budgets_for(acme.subject()) is not None
            and len(budget_cache.cache) > 0
        )
    )
    assert invalidation.freshness.current()
    invalidation.freshness.lost()
    assert not invalidation.freshness.current()
    assert len(budget_cache.cache) == 0
    assert routing.lookups.get(("key", acme.key.key_hash)) is None


def _raw_key(tenant) -> str:
    raw, prefix, digest = ApiKey.generate()
    ApiKey.objects.filter(pk=tenant.key.pk).update(prefix=prefix, key_hash=digest)
    tenant.key.refresh_from_db()
    return raw


def test_a_revoked_key_is_refused_once_its_notice_arrives(acme, listener, settings):
    # given: the key cached for longer than the test (no expiry would empty it)
    raw = _raw_key(acme)
    _caught_up()
    token = routing.lookups.token()
    # Kept only while the listener is current (its fence back within the lease): on a loaded
    # machine it can fall behind for a moment, so authenticate until the lookup is kept.
    _wait_for(
        lambda: routing.authenticate(raw) is not None and routing.lookups.get(("key", acme.key.key_hash)) is not None,
        seconds=10,
    )
    # when: the key is revoked by a plain ORM write (the trigger sends the notice)
    ApiKey.objects.filter(pk=acme.key.pk).update(revoked_at=timezone.now())
    _wait_for(lambda: routing.lookups.token() > token)
    # then: the next request reads it again and is refused
    with pytest.raises(GatewayError) as refused:
        routing.authenticate(raw)
    assert refused.value.code == "revoked_api_key"


def test_without_a_listener_lookups_live_their_seconds(acme, settings):
    # The control of the test above: no notices handled, the revoked key stays cached.
    settings.CAPGATE = {**settings.CAPGATE, "LOOKUP_CACHE_SECONDS": 60.0}
    raw = _raw_key(acme)
    routing.authenticate(raw)
    ApiKey.objects.filter(pk=acme.key.pk).update(revoked_at=timezone.now())
    time.sleep(0.2)
    assert routing.authenticate(raw).revoked_at is None  # served from the cache
    routing.lookups.clear()


def test_a_write_for_one_organization_leaves_anothers_lookups_cached(acme, outsider, listener):
    # given: both organizations' keys cached
    raw_acme, raw_outsider = _raw_key(acme), _raw_key(outsider)
    _caught_up()
    routing.authenticate(raw_acme)
    routing.authenticate(raw_outsider)
    token = routing.lookups.token()
    # when: the outsider's key is revoked (its notice names the outsider's organization alone)
    ApiKey.objects.filter(pk=outsider.key.pk).update(revoked_at=timezone.now())
    _wait_for(lambda: routing.lookups.token() > token)
    # then: the outsider's key is read again and refused; acme's is still served from the cache
    assert routing.lookups.get(("key", outsider.key.key_hash)) is None
    with pytest.raises(GatewayError) as refused:
        routing.authenticate(raw_outsider)
    assert refused.value.code == "revoked_api_key"
    assert routing.lookups.get(("key", acme.key.key_hash)) is not None


def test_a_lookup_read_before_its_organizations_notice_is_not_kept(acme, outsider, settings):
    # The token rule, on the cache alone: a read that began before a notice for its
    # organization was handled may predate the write; one for another organization does not.
    settings.CAPGATE = {**settings.CAPGATE, "LOOKUP_CACHE_SECONDS": 60.0}
    cache = routing._LookupCache()
    token = cache.token()
    cache.changed(str(outsider.org.id))
    cache.put("acme's", "value", token, organization_id=acme.org.id)
    cache.put("outsider's", "value", token, organization_id=outsider.org.id)
    assert cache.get("acme's") == "value"
    assert cache.get("outsider's") is None
    # a notice for every organization makes what was kept stale too
    cache.changed("*")
    assert cache.get("acme's") is None


def test_a_budget_notice_for_every_organization_empties_the_budget_cache(acme, listener):
    # given: acme's budgets cached
    acme.budget(amount="10")
    _caught_up()
    budget_cache.budgets_for(acme.subject())
    misses = budget_cache.cache.misses
    budget_cache.budgets_for(acme.subject())
    assert budget_cache.cache.misses == misses  # served from the cache
    # when: a TRUNCATE's notice, which names no organization, is handled
    invalidation.freshness.on_notification("budgets:*")
    # then: the next read goes to the database
    budget_cache.budgets_for(acme.subject())
    assert budget_cache.cache.misses == misses + 1
