"""What ``cis infer`` tells a newcomer about a served token-id model (issue 43 items 3, 4 and 6): a request whose
token id is outside the model's embedding is answered ``bad_input`` with onnxruntime's reason, shown by the
client and ``cis infer`` (not ``internal`` with the reason in the node's log only), and the node keeps
serving; an npz of token ids goes without ``--bundle`` (the entry node says what its stage 1 takes); samples
that a spent transfer cap kept from going up are counted per node and said so in the summary.

Real parts: the text example's model trained and exported by the CLI, seven ``cis serve`` node processes on
loopback, ZeroMQ requests from ``cis infer`` and :class:`cis.Client`. The spec's total rate of 1 request/s gives
the devices a transfer cap of a fraction of a request per second (a one-token bucket), so a run of a few
hundred requests sent at once is capped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from cli_process import start, started_nodes, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT_MODEL = f"{ROOT / 'examples' / 'text' / 'model.py'}:make"  # vocab 64


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A trained and exported text model served by its seven nodes: (folder, {node: address})."""
    from cis.cli.main import main

    d = tmp_path_factory.mktemp("served")
    rng = np.random.default_rng(0)
    x = rng.integers(30, 64, (300, 16))
    np.savez(d / "topics.npz", x=x, y=rng.integers(0, 4, 300))
    assert main(["spec", "new", "--serving", "60-30-10", "--total-rate", "1", "-o", str(d / "spec.toml")]) == 0
    assert main(["train", "--model", TEXT_MODEL, "--data", str(d / "topics.npz"), "--spec", str(d / "spec.toml"),
                 "--rounds", "1", "--local-steps", "2", "--no-progress", "--out", str(d / "run"), "--json",
                 "--log-level", "warning"]) == 0
    assert main(["export", str(d / "run"), "--out", str(d / "bundle"), "--latency-repeats", "1", "--json",
                 "--log-level", "warning"]) == 0
    proc = start("serve", d / "bundle", "--all", "--free-ports", "--json")
    try:
        yield d, {k: v["address"] for k, v in started_nodes(proc).items()}
    finally:
        stop(proc)


def test_a_token_id_outside_the_vocabulary_is_bad_input_with_the_reason_and_the_node_keeps_serving(
    served, run_cli
):
    from cis import Client
    from cis.runtime.client import ServerError

    d, nodes = served
    x = np.random.default_rng(1).integers(30, 64, (20, 16))
    x[3, 2] = 1000
    np.savez(d / "oov.npz", x=x)
    r = run_cli("infer", "--connect", nodes["device0"], "--dataset", d / "oov.npz", "--bundle", d / "bundle")
    assert r.code == 2 and "sample 3 holds 1000 at position 2 of x; the bundle's model takes token ids 0..63" in r.err
    r = run_cli("infer", "--connect", nodes["device0"], "--dataset", d / "oov.npz", "--window", "1")  # the node's
    assert r.code == 1
    first = r.out.splitlines()[0]
    assert first.startswith("19 of 20 samples answered; errors: bad_input 1 (node device0: stage 1 cannot take this "
                            "input (onnxruntime: InvalidArgument: ")
    assert "idx=1000 must be within the inclusive range [-64,63]" in first
    with Client(nodes["device0"]) as c:
        with pytest.raises(ServerError) as got:
            c.infer(x[3:4])
        assert got.value.code == "bad_input" and "idx=1000" in got.value.message
        assert len(c.infer(x[:2]).cls) == 2  # the next request is served
        status = c.status()
    assert status["errors_by_code"].get("bad_input") == 2 and "internal" not in status["errors_by_code"]


def test_an_npz_of_token_ids_goes_without_a_bundle_as_the_node_says(served, run_cli):
    d, nodes = served
    x = np.random.default_rng(2).integers(30, 64, (12, 16)).astype(np.int32)  # sent as the node's int64
    np.savez(d / "ids.npz", x=x, y=np.arange(12) % 4)
    r = run_cli("infer", "--connect", nodes["device0"], "--dataset", d / "ids.npz", "--json")
    assert r.code == 0, r.err
    assert r.json()["samples_answered"] == 12 and r.json()["errors"] == {}
    np.savez(d / "short.npz", x=x[:, :12])
    r = run_cli("infer", "--connect", nodes["device0"], "--dataset", d / "short.npz")
    assert r.code == 2 and "'x' has samples of shape (12,); the bundle's model takes (16,)" in r.err


def test_capped_samples_are_counted_per_node_and_said_in_the_summary(served, run_cli):
    d, nodes = served
    np.savez(d / "many.npz", x=np.random.default_rng(3).integers(30, 64, (300, 16)))
    r = run_cli("infer", "--connect", nodes["device1"], "--dataset", d / "many.npz", "--json")
    summary = r.json()
    assert summary["capped"] > 0 and summary["capped_per_node"] == {"device1": summary["capped"]}
    human = run_cli("infer", "--connect", nodes["device1"], "--dataset", d / "many.npz").out.splitlines()
    line = next(ln for ln in human if ln.startswith("no labels"))
    capped = int(line.split("capped ")[1].split()[0])
    assert capped > 0 and line.endswith(f"capped {capped} (device1 {capped})")
    said = next(ln for ln in human if ln.startswith("capped:"))
    assert "transfer cap (max_transfer_rate, a token bucket) was spent" in said and "--no-cap" in said
