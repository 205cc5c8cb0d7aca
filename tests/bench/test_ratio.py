"""bench/ratio.py's pieces that can be wrong without the benchmark failing: the tables its raw SQL
names, the database it refuses to drop, the nginx reply, and the profile's arithmetic."""

from __future__ import annotations

import json
import re

import pytest

from bench import ratio
from ledger.models import Reservation, UsageRecord
from tenants.models import Organization


def test_the_raw_sql_names_the_models_tables():
    assert ratio.USAGE_TABLE == UsageRecord._meta.db_table
    assert ratio.RESERVATION_TABLE == Reservation._meta.db_table
    assert ratio.ORGANIZATION_TABLE == Organization._meta.db_table


@pytest.mark.parametrize("name", ["capgate", "test_capgate", "test_capgate_ratiobench", "Capgate; drop", ""])
def test_it_refuses_the_development_and_test_databases(name):
    with pytest.raises(SystemExit):
        ratio.check_database(name)


def test_it_accepts_its_own_database():
    assert ratio.check_database(ratio.DB) == "capgate_bench_ratio"


def test_nginx_answers_the_static_reply_on_loopback_only(tmp_path):
    conf = ratio.nginx_config(str(tmp_path), port=18399)
    assert re.findall(r"listen ([^;]+);", conf) == ["127.0.0.1:18399"]
    reply = json.loads(re.search(r"return 200 '(.*)';", conf).group(1))
    assert reply["usage"] == {"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103}
    assert reply["object"] == "chat.completion"


def test_profile_counts_a_function_once_per_stack_and_leaves_idle_threads_out():
    # given: a recursive capgate stack (3 samples), a library leaf under capgate (2), and the
    # idle samples of an executor's worker and the database pool's worker
    raw = "\n".join(
        [
            "run (gateway/a.py:1);step (gateway/a.py:5);step (gateway/a.py:6) 3",
            "run (gateway/a.py:1);execute (psycopg/cursor.py:9) 2",
            "Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:81) 50",
            "Worker.run (psycopg_pool/_acompat.py:63);Queue.get (queue.py:180);Condition.wait (threading.py:331) 40",
            # uvloop's loop in its C poll: no Python frame above asyncio's runner
            "<module> (uvicorn/main.py:1);run (asyncio/runners.py:190);Runner.run (asyncio/runners.py:118) 7",
            # the same loop running a callback: capgate's frame above it is busy time
            "Runner.run (asyncio/runners.py:118);handle (gateway/a.py:2) 4",
        ]
    )
    # when
    busy, idle, out = ratio.top_functions(raw, {"gateway"})
    # then
    assert (busy, idle) == (9, 97)
    inclusive = out[: out.index("")]
    assert "| `run` | gateway/a.py | 5 | 55.6% |" in inclusive
    assert "| `step` | gateway/a.py | 3 | 33.3% |" in inclusive  # not 6: once per stack
    assert not any("psycopg" in row for row in inclusive)  # capgate's modules only
    own = out[out.index("") + 1 :]
    assert "| `step` | gateway/a.py | 3 | 33.3% |" in own
    assert "| `execute` | psycopg/cursor.py | 2 | 22.2% |" in own
