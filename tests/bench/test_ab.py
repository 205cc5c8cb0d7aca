"""bench/ab.py's pieces that can be wrong without the benchmark failing: the setting it is given
and the order that keeps either worker from always running second."""

from __future__ import annotations

import argparse

import pytest

from bench import ab


def test_the_setting_and_its_two_values():
    assert ab.parse_env("CAPGATE_LOOP_RECORDS=true,false") == ("CAPGATE_LOOP_RECORDS", "true", "false")
    assert ab.parse_env("CAPGATE_SLICE_SHARE=0.5,") == ("CAPGATE_SLICE_SHARE", "0.5", "")


@pytest.mark.parametrize("text", ["CAPGATE_LOOP_RECORDS", "CAPGATE_LOOP_RECORDS=true", "=a,b", "X=a,b,c", "A B=1,2"])
def test_anything_but_a_name_and_two_values_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        ab.parse_env(text)


def test_a_and_b_swap_places_every_round_after_the_reference():
    rounds = [ab.order(n) for n in range(4)]
    assert all(r[0] == "reference" for r in rounds)
    assert [r[1:] for r in rounds] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


def test_b_is_the_same_request_on_its_own_port():
    assert {s.port for s in ab.SYSTEMS.values()} == {ab.ratio.GW_PORT} != {ab.B_PORT}
