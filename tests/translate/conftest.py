"""The live gateway and its tenant (tests/gateway/conftest.py) for the translation tests."""

from tests.gateway.conftest import gateway, slices_mode, upstream, wired  # noqa: F401
