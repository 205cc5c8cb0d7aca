"""A live capgate (uvicorn in a thread, the real ASGI app with its lifespan) in front of a real
fake upstream on 127.0.0.1, and a tenant wired to both."""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
import time
from dataclasses import dataclass
from decimal import Decimal

import pytest
import uvicorn
from django.db import connections, transaction

from catalog.models import Connection, Model, Provider, Route, RouteTarget
from gateway.upstream import dbthreads, runtime
from gateway.upstream import recorder as recorder_module
from tenants.models import ApiKey, hash_key
from tests.conftest import Tenant, make_tenant
from tests.upstream.server import run_in_thread

KEY = "cg_test_key_0123456789"


@pytest.fixture(scope="session")
def upstream():
    handle = run_in_thread()
    yield handle
    handle.stop()


class _Server(uvicorn.Server):
    """uvicorn's server, noticing `should_exit` within 10 ms instead of its 100 ms tick (each
    test's server stops once; the tick is most of its wait). The tick's other work runs as before
    (the date header every 10 ticks)."""

    loop: asyncio.AbstractEventLoop | None = None  # the gateway's event loop, once serving

    async def main_loop(self) -> None:
        self.loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            await asyncio.sleep(0.01)
            should_exit = await self.on_tick(counter)


@dataclass
class LiveGateway:
    url: str
    server: _Server
    thread: threading.Thread

    def recorder(self) -> recorder_module.Recorder:
        """This gateway's usage recorder (gateway/upstream/recorder.py): its event loop's."""
        return recorder_module._recorders[self.server.loop]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The connection settings the gateway's database threads opened their connections with (None: they
# hold none). The threads keep their connections from one test's server to the next, as they do
# for a process's life (opening all of them again cost 0.2 s a test); they are closed when the
# settings changed (a test through PgBouncer, a database outage) and at the session's end
# (`db_threads` in tests/conftest.py).
_threads_opened_with: dict | None = None


def _threads_idle() -> None:
    """Wait until every database thread has finished what the test left it (one no-op each)."""
    for ex in list(dbthreads._executors.values()):
        dbthreads._on_every_thread_of(ex, lambda: None, timeout=10)


@pytest.fixture
def gateway(transactional_db, upstream, settings, db_threads):
    """A capgate server for one test; its lifespan registers the process and starts the drain."""
    from config.asgi import application

    global _threads_opened_with
    upstream.reset()
    runtime.health.reset()
    if _threads_opened_with != connections.settings["default"]:
        runtime.close_thread_connections()
    _threads_opened_with = copy.deepcopy(connections.settings["default"])
    port = _free_port()
    server = _Server(
        uvicorn.Config(
            application, host="127.0.0.1", port=port, lifespan="on", log_level="warning", timeout_graceful_shutdown=2
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("capgate test server did not start")
        time.sleep(0.005)
    yield LiveGateway(url=f"http://127.0.0.1:{port}", server=server, thread=thread)
    server.should_exit = True
    thread.join(timeout=15)
    if thread.is_alive():
        server.force_exit = True  # uvicorn: stop waiting for open connections and tasks
        thread.join(timeout=5)
    _threads_idle()
    # A server left running would go on answering, draining and recording into later tests (a
    # different loop's futures, records drained twice): fail the test that left it.
    assert not thread.is_alive(), "this test's capgate server did not stop within 20 s"


@dataclass
class Wired(Tenant):
    raw_key: str = KEY
    echo: Connection | None = None
    openai: Connection | None = None
    anthropic: Connection | None = None
    model: Model | None = None

    def route(self, name: str, *targets: Connection, model: Model | None = None) -> Route:
        route, _ = Route.objects.get_or_create(organization=self.org, name=name)
        route.targets.all().delete()
        for i, conn in enumerate(targets):
            RouteTarget.objects.create(route=route, connection=conn, model=model or self.model, position=i)
        return route


@pytest.fixture
def wired(transactional_db, upstream) -> Wired:
    """An org whose key reaches: `echo-1` (built-in echo), `gpt-test` (fake OpenAI upstream),
    `claude-test` (fake Anthropic upstream). Prices: $15 / $75 per 1M tokens."""
    # One transaction: one commit (a WAL flush) instead of one per row.
    with transaction.atomic():
        t = make_tenant("acme")
        ApiKey.objects.filter(pk=t.key.pk).update(key_hash=hash_key(KEY))
        t.key.refresh_from_db()
        provider = Provider.objects.create(slug="echo", name="Echo")
        model = Model.objects.create(
            provider=provider,
            name="echo-1",
            input_usd_per_mtok=Decimal("15"),
            output_usd_per_mtok=Decimal("75"),
            cache_read_usd_per_mtok=Decimal("1.5"),
            cache_write_usd_per_mtok=Decimal("18.75"),
            max_output_tokens=4096,
            max_image_tokens=1600,
        )
        w = Wired(org=t.org, project=t.project, key=t.key, keys=t.keys, model=model)
        w.echo = Connection.objects.create(
            organization=t.org, name="echo", kind="echo", options={"allow_fault_headers": True}
        )
        w.openai = Connection.objects.create(
            organization=t.org,
            name="oa",
            kind="openai",
            base_url=upstream.url + "/v1",
            secret="sk-up",
            options={"forward_test_headers": True},
        )
        w.anthropic = Connection.objects.create(
            organization=t.org,
            name="an",
            kind="anthropic",
            base_url=upstream.url,
            secret="sk-ant-up",
            options={"forward_test_headers": True},
        )
        w.route("echo-1", w.echo)
        w.route("gpt-test", w.openai)
        w.route("claude-test", w.anthropic)
    return w


def wait_settled(timeout: float = 10.0) -> None:
    """Wait until the gateway's drain has applied every record (the outbox is empty)."""
    from ledger.models import Reservation, UsageRecord

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not UsageRecord.objects.filter(applied=False).exists() and not Reservation.objects.exists():
            return
        time.sleep(0.05)
    raise AssertionError("records were not settled in time")


@pytest.fixture(params=[False, True], ids=["slices-off", "slices-on"])
def slices_mode(request, settings, monkeypatch) -> bool:
    """Run a money test with headroom slices off and on (ledger/slices.py), with a fresh book."""
    from ledger import slices

    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": request.param}
    return request.param


def assert_nothing_held() -> None:
    """No reservation, no hold and no usage row: what a refused request must leave."""
    from ledger.models import Hold, Reservation, UsageRecord

    assert not Reservation.objects.exists()
    assert not Hold.objects.exists()
    assert not UsageRecord.objects.exists()


@pytest.fixture
def counted(wired, settings):
    """gpt-test served by a model with a tokenizer (o200k_base); the fake upstream counts prompts like
    OpenAI (tests/gateway/test_exact_counts.py, test_token_counter.py)."""
    provider = Provider.objects.create(slug="openai", name="OpenAI")
    model = Model.objects.create(
        provider=provider,
        name="gpt-counted",
        input_usd_per_mtok=Decimal("1"),
        output_usd_per_mtok=Decimal("2"),
        max_output_tokens=4096,
        tokenizer="o200k_base",
    )
    wired.route("gpt-test", wired.openai, model=model)
    return wired
