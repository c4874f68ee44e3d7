"""Every request gets exactly one reply, even one whose result cannot be sent: a result's header names the
serving node once per sample (``served_by``), so a request of enough samples would need a header over the
protocol's 1 MiB, which every receiver refuses. The node answers it ``too_large`` instead, saying why, and
keeps serving (found by a hunt: the node sent it anyway, the client dropped it, the request timed out).

A real node process (``cis serve``) with a 128-character id, the digits bundle, a real Client."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import read_until, start, stop  # noqa: E402

from cis.runtime.client import Client, ServerError  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402

LONG_ID = "n" * 128


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from cis.core.spec import CisSpec, Node, validate, write_spec
    from cis.exporter.fixture_bundle import make_demo_bundle

    root = tmp_path_factory.mktemp("big")
    bundle = make_demo_bundle(root, steps=20)
    spec = root / "spec.toml"
    write_spec(validate(CisSpec((Node(LONG_ID, 3),), 3, name="long")), spec)
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", bundle, "--node", LONG_ID, "--spec", spec, "--bind", address, "--provider", "cpu",
                 "--queue-limit", 20000)  # fmt: skip
    read_until(proc.stderr, proc, "node_start")
    yield address
    assert stop(proc) == 0


def test_a_result_too_big_for_its_header_is_answered_too_large_and_the_node_serves_on(node):
    from cis.training.data.loading import load_dataset

    x = load_dataset("digits", seed=0).test.x.astype(np.float32)
    big = np.ascontiguousarray(np.resize(x, (9000, *x.shape[1:])))  # 9,000 x 130 bytes of served_by > 1 MiB
    with Client(node, timeout=60, retry_after=None) as c:
        with pytest.raises(ServerError) as got:
            c.infer(big)
        assert got.value.code == "too_large" and "the result of 9000 samples needs a" in str(got.value)
        assert "send fewer samples a request" in str(got.value)
        small = c.infer(x[:100])  # the node serves on
        assert len(small.cls) == 100 and set(small.served_by) == {LONG_ID}
