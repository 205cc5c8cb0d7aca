"""Fixtures shared by the ledger's slice tests."""

import pytest


@pytest.fixture
def slices_on(settings):
    """Headroom slices on, small and long-lived: 20 worst cases at most, none under 4, 60 s each."""
    settings.CAPGATE = {
        **settings.CAPGATE,
        "SLICES": True,
        "SLICE_SHARE": 0.5,
        "SLICE_MIN_REQUESTS": 4,
        "SLICE_MAX_REQUESTS": 20,
        "SLICE_SECONDS": 60.0,
    }
