"""Usage records written in batches (the gateway's group commit, issue 12 §2): one INSERT for a
batch, idempotent per request id, and a batch the database refuses as a whole is written again
one record at a time, so one bad record (its subject deleted in flight) loses nobody's cost."""

from __future__ import annotations

import pytest
from django.db import DataError, IntegrityError, connection

from catalog.pricing import Usage
from ledger import recording
from ledger.drain import drain
from ledger.models import Reservation, UsageRecord
from ledger.recording import Outcome, build_record, record_many
from tenants.models import ApiKey
from tests.conftest import window_of

# Outside a test transaction: record_many takes the gateway's path (one implicit transaction).
pytestmark = pytest.mark.django_db(transaction=True)
WORST = 1_000


def _admitted(acme, n: int, key: ApiKey | None = None) -> list[Reservation]:
    return [acme.admit(worst_nano=WORST, key=key).reservation for _ in range(n)]


def _statements(fn):
    sent: list[str] = []

    def count(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        result = fn()
    return result, sent


def test_a_batch_is_one_statement_and_a_second_report_keeps_the_first(acme):
    # given: five admitted requests under a cap
    budget = acme.budget(amount="1")
    reservations = _admitted(acme, 5)
    # when: their outcomes are recorded together
    out, sent = _statements(
        lambda: record_many(items=[(r, Outcome(status="served", cost_nano=7)) for r in reservations])
    )
    # then: one statement (its relaxed commit set inside it), five records
    assert len(sent) == 1
    assert [type(r) for r in out] == [UsageRecord] * 5
    assert UsageRecord.objects.count() == 5
    # a second report of the first request is kept for the audit, never a second record
    [again] = record_many(items=[(reservations[0], Outcome(status="served", cost_nano=9))])
    assert again.pk == out[0].pk and again.cost_nano == 7 and again.reported_cost_nano == 9
    assert UsageRecord.objects.count() == 5
    assert drain() == 5
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (35, 0)


def test_a_key_deleted_in_flight_does_not_lose_the_batch(acme):
    # given: a batch in which one request's key was deleted while it was in flight
    budget = acme.budget(amount="1")
    doomed = acme.add_key("doomed")
    reservations = _admitted(acme, 2) + _admitted(acme, 1, key=doomed) + _admitted(acme, 2)
    ApiKey.objects.filter(pk=doomed.pk).delete()
    # when
    out = record_many(items=[(r, Outcome(status="served", cost_nano=7)) for r in reservations])
    # then: every record is written; the deleted key's is detached, its id kept in `subject`
    assert [type(r) for r in out] == [UsageRecord] * 5
    gone = UsageRecord.objects.get(request_id=reservations[2].request_id)
    assert gone.api_key_id is None and gone.subject["api_key"]["id"] == doomed.pk
    drain()
    assert window_of(budget).spent_nano == 35


def test_without_splitting_a_refused_batch_one_bad_record_loses_them_all(acme, monkeypatch):
    # given: the guard removed
    monkeypatch.setattr(recording.GUARDS, "split_refused_batch", False)
    doomed = acme.add_key("doomed")
    reservations = _admitted(acme, 2) + _admitted(acme, 1, key=doomed) + _admitted(acme, 2)
    ApiKey.objects.filter(pk=doomed.pk).delete()
    # when / then: the whole batch is refused, the four good records with it
    with pytest.raises(IntegrityError):
        record_many(items=[(r, Outcome(status="served", cost_nano=7)) for r in reservations])
    assert not UsageRecord.objects.exists()


def test_a_negative_cost_is_refused_for_its_own_record_only(acme):
    reservations = _admitted(acme, 2)
    out = record_many(
        items=[
            (reservations[0], Outcome(status="served", cost_nano=-1)),
            (reservations[1], Outcome(status="served", cost_nano=7)),
        ]
    )
    assert isinstance(out[0], ValueError) and isinstance(out[1], UsageRecord)
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == [reservations[1].request_id]


# What the ORM itself would write for a record, column by column, except what the database picks.
_ORM_FIELDS = [f.attname for f in UsageRecord._meta.concrete_fields if f.attname not in ("id", "created_at")]


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(
            status="served",
            cost_nano=1_234_567_890_123,
            usage=Usage(input_tokens=11, output_tokens=22, cache_read_tokens=33, cache_write_tokens=44),
            provider_model="gpt-4o-2024-08-06",
            error="",
            latency_ms=321,
            input_bound="exact",
        ),
        Outcome(status="failed_upstream", error='upstream said «no» \\ "quoted"\n', latency_ms=None),
        Outcome(status="released"),
    ],
    ids=["served", "failed", "released"],
)
def test_the_group_commit_writes_every_column_as_the_orm_would(acme, outcome):
    # given: an admitted request, with a run id too
    acme.budget(amount="1")
    reservation = _admitted(acme, 1)[0]
    reservation.run_id = "run-7"
    expected = build_record(reservation=reservation, outcome=outcome)  # the ORM's own instance
    # when: it is written by the group commit's statement
    [written] = record_many(items=[(reservation, outcome)])
    # then: the row, and the instance returned, hold what the ORM's instance holds, field by field
    row = UsageRecord.objects.get(request_id=reservation.request_id)
    assert written.pk == row.pk and not written._state.adding
    for name in _ORM_FIELDS:
        assert getattr(row, name) == getattr(expected, name), name
        assert getattr(written, name) == getattr(expected, name), name
    assert written.created_at == row.created_at  # to the microsecond: times go in full
    assert row.admitted_at == reservation.created_at


def test_a_value_too_long_for_its_column_is_refused_not_cut_short(acme):
    # given: a provider model name longer than its column holds
    acme.budget(amount="1")
    reservation = _admitted(acme, 1)[0]
    long_name = "m" * (UsageRecord._meta.get_field("provider_model").max_length + 1)
    # when / then: refused as the ORM's insert would refuse it, nothing written (never truncated)
    with pytest.raises(DataError):
        record_many(items=[(reservation, Outcome(status="served", cost_nano=7, provider_model=long_name))])
    assert not UsageRecord.objects.exists()


def test_the_group_commit_is_prepared_on_a_direct_connection_and_stays_correct(acme):
    # given: a direct connection (the suite's), on which server-bound statements are prepared
    # from their third execution (config/settings/pooling.py)
    assert connection.settings_dict["OPTIONS"]["prepare_threshold"] == 2
    budget = acme.budget(amount="1")

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
            return [s for (s,) in cursor.fetchall() if "jsonb_array_elements" in s]

    # when: four batches of the group commit on this connection
    for n in (1, 2, 3, 4):
        record_many(items=[(r, Outcome(status="served", cost_nano=7)) for r in _admitted(acme, n)])
    # then: its one text is prepared once, and the prepared statement wrote every record
    assert len(prepared()) == 1
    assert UsageRecord.objects.count() == 10
    assert drain() == 10
    assert window_of(budget).spent_nano == 70


def _run_on_own_connection(batch: recording.Batch) -> tuple:
    """The batch's statement on a connection of its own, as the gateway's event loop sends it
    (gateway/upstream/loopdb.py)."""
    import psycopg

    from gateway.upstream.loopdb import connection_params

    params = {**connection_params(), "prepare_threshold": None}
    params.pop("connect_timeout")
    with psycopg.connect(**params) as conn:
        return conn.execute(batch.sql, batch.params).fetchone()


def test_a_batch_written_elsewhere_is_completed_without_the_database_unless_it_must_be(acme):
    # given: three admitted requests, one of them recorded already
    budget = acme.budget(amount="1")
    reservations = _admitted(acme, 3)
    [first] = record_many(items=[(reservations[0], Outcome(status="served", cost_nano=7))])
    fresh = recording.prepare_batch([(r, Outcome(status="served", cost_nano=7)) for r in reservations[1:]])
    again = recording.prepare_batch([(reservations[0], Outcome(status="served", cost_nano=9))])
    # when: each statement runs on a connection of its own
    fresh_result, again_result = _run_on_own_connection(fresh), _run_on_own_connection(again)
    # then: the fresh records need nothing more than their ids, read from the statement's answer
    assert not recording.complete_needs_database(fresh, fresh_result)
    out, sent = _statements(lambda: recording.complete_batch(fresh, fresh_result))
    assert sent == [] and [r.request_id for r in out] == [r.request_id for r in reservations[1:]]
    assert {r.pk for r in out} == set(UsageRecord.objects.exclude(pk=first.pk).values_list("pk", flat=True))
    # the second report must look its first record up: completed as record_many completes it
    assert recording.complete_needs_database(again, again_result)
    [kept] = recording.complete_batch(again, again_result)
    assert kept.pk == first.pk and kept.cost_nano == 7 and kept.reported_cost_nano == 9
    assert UsageRecord.objects.count() == 3
    drain()
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (21, 0)


def test_a_batch_with_nothing_to_write_has_no_statement(acme):
    # given: an outcome with a negative cost (refused before any write)
    [reservation] = _admitted(acme, 1)
    batch = recording.prepare_batch([(reservation, Outcome(status="served", cost_nano=-1))])
    # then: nothing to send, and the item's error in its place
    assert batch.todo == [] and batch.params == []
    assert [type(r) for r in batch.out] == [ValueError]
