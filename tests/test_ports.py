"""Planned ports: below the ephemeral range, free, never handed out twice (cis.runtime.ports)."""

from __future__ import annotations

import random
import socket

from cis.runtime import ports
from cis.runtime.ports import PLANNED_LOW, free_port, pick_port, planned_range


def test_the_planned_range_ends_where_the_ephemeral_range_starts():
    assert planned_range((32768, 60999)) == range(PLANNED_LOW, 32768)
    assert planned_range(None) is None  # not Linux: the kernel picks
    assert planned_range((PLANNED_LOW + 500, 60999)) is None  # too little room below


def test_a_port_in_use_or_taken_is_passed_over():
    busy = set(range(20000, 20010))
    taken = {20010, 20011}
    got = {
        pick_port(range(20000, 20013), lambda p: p not in busy, lambda: 40000, taken, random.Random(s))
        for s in range(20)
    }
    assert got == {20012}


def test_the_kernel_picks_when_no_draw_is_free():
    kernel = iter([40001, 40002])
    port = pick_port(range(20000, 20002), lambda p: False, lambda: next(kernel), {40001}, random.Random(0))
    assert port == 40002
    assert pick_port(None, lambda p: True, lambda: 40003, set(), random.Random(0)) == 40003


def test_free_ports_are_bindable_distinct_and_below_the_ephemeral_range():
    got = [free_port() for _ in range(50)]
    assert len(set(got)) == 50
    planned = planned_range(ports.ephemeral_range())
    if planned is not None:
        assert all(p in planned for p in got)
    for p in got[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
