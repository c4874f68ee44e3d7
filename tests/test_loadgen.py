"""The load generator (``cis bench``, cis.runtime.loadgen) against a real node process over its three transports:

- the schedule: Poisson arrivals (cis.core.arrivals, the simulator's) repeatable by seed, ``uniform`` evenly spaced,
  ``--requests`` or ``--duration``; bad input one line and exit status 2;
- zmq, http and grpc each answer every request; the JSON holds p50/p99, the held rate and errors by class;
  ``--out`` writes requests.csv in cis.core.records' layout (``correct`` from the data's labels);
- an open loop: a server that never answers still receives every request on schedule;
- errors by class: a bad input is counted under the node's code on every transport.
"""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import zmq

from cis.core.errors import CisError
from cis.core.records import REQUEST_COLUMNS, read_requests
from cis.runtime.loadgen import run_load, schedule
from cis.runtime.ports import free_port

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import read_until, start, stop  # noqa: E402


def test_poisson_schedule_is_the_seeded_process_and_uniform_is_even():
    a = schedule("poisson", 50.0, requests=400, seed=3)
    assert len(a) == 400 and a[0] == 0.0 and np.all(np.diff(a) > 0)
    assert np.array_equal(a, schedule("poisson", 50.0, requests=400, seed=3))
    assert not np.array_equal(a, schedule("poisson", 50.0, requests=400, seed=4))
    gaps = np.diff(a)
    assert 0.015 < gaps.mean() < 0.025 and gaps.std() > 0.5 * gaps.mean()  # exponential: std = mean
    u = schedule("uniform", 40.0, duration=2.0)
    assert np.allclose(np.diff(u), 1 / 40) and len(u) == 80 and u[-1] < 2.0


def test_a_spec_load_enters_at_the_nodes_with_arrivals_in_proportion_to_their_rates():
    from cis.core.topologies import make_spec
    from cis.runtime.loadgen import spec_entries

    spec = make_spec("paper-7", "60-30-10")
    nodes, pick = spec_entries(spec, 400, seed=2)
    assert sorted(nodes) == sorted(n.id for n in spec.nodes if n.arrival_rate > 0)
    counts = np.bincount(pick, minlength=len(nodes))
    rates = np.array([spec.node(n).arrival_rate for n in nodes])
    assert np.allclose(counts / 400, rates / rates.sum(), atol=0.01)
    assert np.array_equal(pick, spec_entries(spec, 400, seed=2)[1])


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"arrivals": "bursty", "rate": 1.0, "requests": 2}, "--arrivals bursty"),
        ({"arrivals": "poisson", "rate": 0.0, "requests": 2}, "--rate 0"),
        ({"arrivals": "poisson", "rate": 1.0, "requests": 0}, "--requests 0"),
        ({"arrivals": "poisson", "rate": 1.0, "duration": -1.0}, "--duration -1"),
        ({"arrivals": "poisson", "rate": 1.0, "requests": 2, "duration": 1.0}, "give one of the two"),
    ],
)
def test_bad_schedule_says_what_was_expected(kwargs, said):
    with pytest.raises(CisError, match=re.escape(said)):
        schedule(**kwargs)


def test_an_open_loop_sends_on_schedule_while_nothing_answers():
    """A ROUTER that reads and never answers: every request arrives, sent at its time, none waits for the one
    before (a closed loop would send the second only after the first's 5 s timeout)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    got: list[int] = []
    stop_reading = threading.Event()

    def read() -> None:
        while not stop_reading.is_set():
            if sock.poll(50):
                frames = sock.recv_multipart()
                got.append(len(frames))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        x = np.zeros((1, 1, 8, 8), np.float32)
        result = run_load(f"tcp://127.0.0.1:{port}", 100.0, requests=20, x=x, input_name="input", timeout=5.0,
                          seed=1)
    finally:
        stop_reading.set()
        reader.join()
        sock.close(0)
    assert len(got) == 20
    s = result.summary()
    assert s["errors"] == {"timeout": 20} and s["answered"] == 0 and s["held_rate"] == 0.0
    assert float(np.max(result.sent - result.due)) < 5.0  # no send waited for an answer or a timeout
    assert s["latency"]["count"] == 0 and s["p99_all_s"] == "inf"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A digits node with all three doors, and a labelled npz of its samples."""
    from cis.exporter.fixture_bundle import make_demo_bundle
    from cis.training.data.loading import load_dataset

    work = tmp_path_factory.mktemp("bench")
    bundle = make_demo_bundle(work, steps=150)
    test = load_dataset("digits", seed=0).test
    np.savez(work / "digits.npz", x=test.x[:30].astype(np.float32), y=test.y[:30])
    np.savez(work / "wrong.npz", x=np.zeros((4, 1, 5, 5), np.float32))
    zmq_addr = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", bundle, "--node", "cloud", "--bind", zmq_addr, "--provider", "cpu", "--http-port", 0,
                 "--grpc-port", 0)  # fmt: skip
    try:
        text = "".join(read_until(proc.stderr, proc, "node_start"))
        doors = {"zmq": zmq_addr, "http": re.search(r"http front door at (\S+)", text).group(1),
                 "grpc": re.search(r"grpc front door at (\S+)", text).group(1)}  # fmt: skip
        yield doors, work
    finally:
        stop(proc)


@pytest.mark.parametrize("transport", ["zmq", "http", "grpc"])
def test_bench_answers_every_request_and_writes_requests_csv(node, run_cli, tmp_path, transport):
    pytest.importorskip("grpc")
    doors, work = node
    out = tmp_path / "out"
    r = run_cli("bench", doors[transport], "--transport", transport, "--rate", "200", "--requests", "40",
                "--data", str(work / "digits.npz"), "--out", str(out), "--json")  # fmt: skip
    assert r.code == 0, r.err
    s = r.json()
    assert s["requests"] == s["answered"] == 40 and s["errors"] == {}
    assert s["transport"] == transport and s["arrivals"] == "poisson" and s["rate"] == 200.0
    assert s["latency"]["count"] == 40 and 0 < s["latency"]["p50_s"] <= s["latency"]["p99_s"]
    assert s["held_rate"] == pytest.approx(s["sent_rate"]) and s["sent_rate"] > 0
    assert set(s["served_share_per_exit"]) <= {"1", "2", "3"} and 0.5 < s["accuracy"] <= 1.0
    rows = read_requests(out / "requests.csv")
    assert (out / "requests.csv").read_text().splitlines()[0] == ",".join(REQUEST_COLUMNS)
    assert len(rows["id"]) == 40 and set(rows["outcome"]) == {"served"} and set(rows["node"]) == {"cloud"}
    assert np.all(rows["correct"] >= 0) and np.all(np.isfinite(rows["latency_s"]))
    assert json.loads((out / "bench.json").read_text())["answered"] == 40


def test_bench_without_data_sends_samples_of_the_input_the_node_names(node, run_cli):
    doors, _ = node
    r = run_cli("bench", doors["zmq"], "--rate", "100", "--requests", "10", "--arrivals", "uniform", "--json")
    assert r.code == 0, r.err
    assert r.json()["answered"] == 10 and "accuracy" not in r.json()


@pytest.mark.parametrize("transport", ["zmq", "http", "grpc"])
def test_errors_are_counted_by_class(node, run_cli, transport):
    """Samples of the wrong shape: each refused, counted under the node's code, the node still serving."""
    pytest.importorskip("grpc")
    doors, work = node
    r = run_cli("bench", doors[transport], "--transport", transport, "--rate", "100", "--requests", "6",
                "--data", str(work / "wrong.npz"), "--json")  # fmt: skip
    assert r.code == 1  # nothing answered
    s = r.json()
    assert s["answered"] == 0 and sum(s["errors"].values()) == 6
    (code,) = s["errors"]
    assert code.startswith("bad_"), s["errors"]
    again = run_cli("bench", doors[transport], "--transport", transport, "--rate", "100", "--requests", "5", "--json")
    assert again.json()["answered"] == 5


@pytest.mark.parametrize(
    "argv, said",
    [
        (["tcp://127.0.0.1:{port}", "--rate", "10", "--requests", "2", "--timeout", "0.5"], "no node answers status"),
        (["http://127.0.0.1:{port}", "--transport", "http", "--rate", "10"], "no model metadata"),
        (["tcp://127.0.0.1:1", "--transport", "http", "--rate", "10"], "not an HTTP address"),
        (["http://127.0.0.1:1", "--rate", "10"], "not a ZeroMQ address"),
        (["tcp://127.0.0.1:1", "--rate", "-3"], "--rate -3"),
        (["tcp://127.0.0.1:1", "--rate", "3", "--timeout", "0"], "--timeout 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_cli, argv, said):
    port = free_port()
    r = run_cli("bench", *[a.format(port=port) for a in argv])
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err
