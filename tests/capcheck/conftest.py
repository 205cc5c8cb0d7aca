"""capcheck runs against the live in-process gateway of tests/gateway (uvicorn in a thread with
the real ASGI app and its lifespan: heartbeat, micro-batch drain)."""

import pytest

from tests.gateway.conftest import gateway, upstream  # noqa: F401  (fixtures)


@pytest.fixture(params=[True, False], ids=["slices-on", "slices-off"])
def slices_setting(request, settings, monkeypatch):
    """The gateway's headroom slices on (as in production) and off, with a fresh book."""
    from ledger import slices

    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": request.param, "SLICE_MIN_REQUESTS": 2}
    return request.param
