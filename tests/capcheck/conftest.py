"""capcheck runs against the live in-process gateway of tests/gateway (uvicorn in a thread with
the real ASGI app and its lifespan: heartbeat, micro-batch drain)."""

from tests.gateway.conftest import gateway, upstream  # noqa: F401  (fixtures)
