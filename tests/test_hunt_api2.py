"""One line (CisError) for a user's mistakes with the Python API that gave a raw traceback deep inside (a second
hunt): a closed Client used again (and closed twice), an empty dict or a scalar as a batch, a timeout that cannot
work given to Client.infer or Client.status, a window, batch size or rate of the wrong type, infer_spread's entries
naming a node without a client or a sample x has not, and cis.infer given x that is no array of numbers, labels
that are not whole numbers, or a cis.serve(...) whose nodes were stopped.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("onnx")

from test_bundle import D, bundle_dir, weights  # noqa: E402, F401  (a hand-built 3-stage ONNX bundle: no torch)

import cis  # noqa: E402
from cis.core.errors import CisError  # noqa: E402
from cis.runtime.client import Client, infer_spread  # noqa: E402

DEAD = "tcp://127.0.0.1:1"  # nothing listens there


def test_a_closed_client_says_so_and_closes_twice():
    c = Client(DEAD)
    c.close()
    c.close()  # was zmq.error.ZMQError: Socket operation on non-socket
    with pytest.raises(CisError, match=r"is closed; expected an open Client"):
        c.infer(np.zeros((1, D), np.float32))
    with pytest.raises(CisError, match=r"is closed; expected an open Client"):
        c.status()


@pytest.mark.parametrize("batch, message", [
    ({}, "batch is an empty dict; expected"),
    ({"input": np.float32(1.0)}, "batch 'input' is a scalar"),
    (np.float32(1.0), "batch 'input' is a scalar"),  # not sent as shape [1]
    (1.0, "batch 'input' is a scalar"),
    ({3: np.zeros((1, D), np.float32)}, "expected input names"),
])  # fmt: skip
def test_a_batch_without_samples_is_one_line(batch, message):
    with Client(DEAD) as c, pytest.raises(CisError, match=message):
        c.infer(batch, timeout=0.5)  # was StopIteration / TypeError from len()


@pytest.mark.parametrize("timeout", [0, -1, "1", float("nan")])
def test_client_infer_and_status_refuse_a_timeout_that_cannot_work(timeout):
    with Client(DEAD) as c:
        with pytest.raises(CisError, match="expected a finite number of seconds > 0"):
            c.infer(np.zeros((1, D), np.float32), timeout=timeout)  # was TimeoutError at once, or a TypeError
        with pytest.raises(CisError, match="expected a finite number of seconds > 0"):
            c.status(timeout=timeout)
        assert c.in_flight == 0  # nothing was sent


@pytest.mark.parametrize("option, message", [
    ({"batch_size": "2"}, "batch size is '2'"), ({"batch_size": 1.5}, "batch size is 1.5"),
    ({"window": "2"}, "window is '2'"), ({"window": None}, "window is None"), ({"rate": "5"}, "rate is '5'"),
])  # fmt: skip
def test_pacing_of_the_wrong_type_is_one_line(option, message):
    with Client(DEAD) as c, pytest.raises(CisError, match=message):
        c.infer_many(np.zeros((2, D), np.float32), **option)


def test_infer_spread_entries_it_cannot_send_are_one_line():
    x = np.zeros((2, D), np.float32)
    with Client(DEAD) as c:
        with pytest.raises(CisError, match=r"entries name node 'b'; expected one of clients' a"):
            infer_spread({"a": c}, x, {"b": np.arange(2)}, timeout=1)  # was KeyError
        with pytest.raises(CisError, match=r"entries\['a'\] holds sample 2; expected indices 0..1 of x"):
            infer_spread({"a": c}, x, {"a": np.arange(3)}, timeout=1)  # was IndexError after sending


@pytest.mark.parametrize("x", [3.0, "abc", np.array([None, None])])
def test_cis_infer_x_that_is_no_array_of_numbers_is_one_line(x):
    with pytest.raises(CisError, match=r"cis.infer: x is a .*expected an array or tensor of samples"):
        cis.infer(DEAD, x, timeout=0.5)


@pytest.mark.parametrize("y", [[0.5, 1.2], ["a", "b"], [np.nan, 1.0]])
def test_cis_infer_labels_that_are_not_whole_numbers_are_one_line(y):
    """Fractions were cut to integers without a word, text raised int()'s ValueError, NaN a cast warning."""
    with pytest.raises(CisError, match=r"cis.infer: y has dtype .*expected class indices \(whole numbers\)"):
        cis.infer(DEAD, np.zeros((2, D), np.float32), y, timeout=0.5)


def test_cis_infer_on_stopped_nodes_says_so(bundle_dir):  # noqa: F811
    """It waited the whole timeout and returned every request as a timeout error."""
    with cis.serve(bundle_dir) as served:
        assert cis.infer(served, np.zeros((2, D), np.float32), [0, 1]).summary["requests"] == 2
    with pytest.raises(CisError, match=r"cis.infer: its cis.serve\(...\) nodes are stopped"):
        cis.infer(served, np.zeros((2, D), np.float32), timeout=30)


@pytest.mark.parametrize("call", [lambda: cis.serve(5), lambda: cis.export(5)])
def test_serve_and_export_name_a_bundle_or_run_of_the_wrong_type(call):
    with pytest.raises(CisError, match=r"cis.(serve: bundle|export: run) is a int \(5\); expected"):
        call()


@pytest.mark.parametrize("kwargs, said", [
    ({"curve": "x"}, "curve is a str; expected a cis.runtime.security.CurveConfig"),
    ({"retry_after": "1"}, "retry_after is '1'; expected seconds >= 0"),
    ({"retry_after": -1.0}, "retry_after is -1.0; expected seconds >= 0"),
])  # fmt: skip
def test_client_connection_options_of_the_wrong_kind_are_one_line(kwargs, said):
    with pytest.raises(CisError, match=f"^Client: {re.escape(said)}"):
        Client("tcp://127.0.0.1:5", **kwargs)
