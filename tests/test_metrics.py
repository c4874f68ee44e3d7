"""The one metrics vocabulary (cis/core/records.py): latency summary, requests.csv, JSON numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cis.core.records import (
    LATENCY_KEYS,
    REQUEST_COLUMNS,
    format_ms,
    json_float,
    latency_summary,
    read_requests,
    served_latencies,
    write_requests,
)


def test_latency_summary_is_seconds_in_seconds_out_and_skips_unknowns():
    s = latency_summary([0.004, 0.001, float("nan"), 0.002, 0.003, float("inf")])
    assert tuple(s) == LATENCY_KEYS
    assert s["count"] == 4 and s["mean_s"] == pytest.approx(0.0025) and s["max_s"] == 0.004
    assert s["p50_s"] == pytest.approx(0.0025) and s["p50_s"] <= s["p95_s"] <= s["p99_s"] <= s["max_s"]
    empty = latency_summary(np.zeros(0))
    assert empty == {"count": 0, "mean_s": None, "p50_s": None, "p95_s": None, "p99_s": None, "max_s": None}
    assert format_ms(0.00123) == "1.23" and format_ms(None) == "-" and format_ms(float("nan")) == "-"


def test_json_float_writes_infinities_as_strings():
    out = json.dumps({k: json_float(v) for k, v in {"a": 0.5, "b": math.inf, "c": -math.inf}.items()})
    assert json.loads(out) == {"a": 0.5, "b": "inf", "c": "-inf"}


def test_requests_csv_round_trip(tmp_path):
    path = tmp_path / "requests.csv"
    write_requests(path, {
        "id": [0, 1, 2],
        "entry": ["d0", "d1", "d0"],
        "node": ["d0", "cloud", None],
        "exit": [1, 3, None],
        "outcome": ["served", "served", "error"],
        "correct": [1, None, None],
        "latency_s": [0.001, 0.0042, None],
        "flags": [0, 2, None],
    })
    assert path.read_text().splitlines()[0] == ",".join(REQUEST_COLUMNS)
    got = read_requests(path)
    assert got["id"].tolist() == ["0", "1", "2"] and got["node"].tolist() == ["d0", "cloud", ""]
    assert got["exit"].tolist() == [1, 3, 0] and got["correct"].tolist() == [1, -1, -1]
    assert got["flags"].tolist() == [0, 2, 0]
    assert np.isnan(got["arrive_s"]).all() and got["latency_s"][1] == pytest.approx(0.0042)
    latency, exits = served_latencies(got)
    assert latency.tolist() == pytest.approx([0.001, 0.0042]) and exits.tolist() == [1, 3]
    with pytest.raises(ValueError, match="unknown columns"):
        write_requests(path, {"sample": [1]})
