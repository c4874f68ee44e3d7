"""cis status and cis rollout on inputs a hunt found mishandled: a cluster.json given as a file, a node that
answers with an error, a huge --timeout, --server-key alone, a bundle that has no threshold for a node."""

from __future__ import annotations

import json
import os
import threading

import pytest
import zmq

from cis.cli.commands.status import read_cluster
from cis.core.errors import CisError
from cis.runtime import protocol as P

pytest.importorskip("onnx")
from test_bundle import bundle_dir, weights  # noqa: E402, F401  (a hand-built 3-stage ONNX bundle: no torch)


class FakeNode:
    """A ROUTER that answers every message: an error (``error``) or a status reply of its own counters."""

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            ident, msg = frames[0], P.decode(frames[1:])
            if self.error:
                P.send(self.sock, P.error_frames(msg.id, self.error, "a\nmulti-line\nmessage"), prefix=[ident])
            else:
                reply = {"served": 7, "pid": os.getpid()}
                P.send(self.sock, P.encode(P.STATUS_REPLY, msg.id, status=reply), prefix=[ident])

    def __enter__(self) -> FakeNode:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()


def test_a_node_answering_an_error_is_its_own_row_and_the_others_still_come(run_cli):
    with FakeNode(error="bad_version") as bad, FakeNode() as good:
        res = run_cli("status", "--connect", bad.address, "--connect", good.address, "--json")
    assert res.code == 1, res.err  # a node down: exit 1, no error line
    nodes = json.loads(res.out)["nodes"]
    assert nodes[bad.address]["live"] is False
    assert nodes[bad.address]["error"] == "bad_version: a multi-line message"  # one line
    assert nodes[good.address]["live"] is True
    assert res.err == ""


def test_a_huge_timeout_waits_as_long_as_needed_without_overflowing(run_cli):
    with FakeNode() as node:
        res = run_cli("status", "--connect", node.address, "--timeout", "1e17", "--json")
    assert res.code == 0, res.err
    assert json.loads(res.out)["nodes"][node.address]["live"] is True


def test_a_cluster_state_is_read_from_its_folder_or_its_file(tmp_path):
    state = {"nodes": {"cloud": {"address": "tcp://127.0.0.1:5"}}, "spec": "s.toml"}
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    assert read_cluster(str(tmp_path)) == read_cluster(str(tmp_path / "cluster.json")) == state
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": {"cloud": {}}}))
    with pytest.raises(CisError, match="not a cluster state file"):
        read_cluster(str(tmp_path))
    with pytest.raises(CisError, match="not found"):
        read_cluster(str(tmp_path / "elsewhere"))


def test_rollout_takes_cluster_json_and_says_how_to_get_a_bundle_that_fits(bundle_dir, tmp_path, run_cli):  # noqa: F811
    from cis.core.spec import write_spec
    from cis.core.topologies import make_spec

    spec = tmp_path / "p17.toml"
    write_spec(make_spec("paper-17", "60-30-10"), spec)
    ids = [n.id for n in make_spec("paper-17", "60-30-10").nodes]
    nodes = {nid: {"address": f"tcp://127.0.0.1:{9000 + i}"} for i, nid in enumerate(ids)}
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": nodes, "spec": str(spec)}))
    res = run_cli("rollout", bundle_dir, "--cluster", tmp_path / "cluster.json", "--timeout", "1")
    (line,) = res.err.strip().splitlines()
    # the file was read: its first node's address is asked (the fit is checked once the nodes answered, with
    # each node's --threshold from its status)
    assert res.code == 2 and f"node {ids[0]} at tcp://127.0.0.1:9000 does not answer" in line, res.err
    assert "nothing was changed" in line
    from cis.core.bundle import load_bundle
    from cis.runtime.rollout import check_fits

    with pytest.raises(CisError) as got:
        check_fits(load_bundle(bundle_dir), make_spec("paper-17", "60-30-10"), dict.fromkeys(ids))
    assert "does not fit spec 'paper-17'" in str(got.value) and "cis export RUN --spec SPEC" in str(got.value)
    assert "nothing was changed" in str(got.value)


def test_rollout_server_key_without_curve_key_is_one_line(bundle_dir, tmp_path, run_cli):  # noqa: F811
    res = run_cli("rollout", bundle_dir, "--spec", tmp_path / "none.toml", "--server-key", tmp_path / "k.key")
    assert res.code == 2
    assert res.err.strip() == (
        "cis rollout: error: rollout: --server-key goes with --curve-key (CurveZMQ needs this client's own key too)"
    )


@pytest.mark.parametrize("port, said", [("99999", "port past 65535"), ("0", "port 0")])
def test_a_port_no_node_can_have_is_one_line_not_a_node_down(run_cli, port, said):
    res = run_cli("status", "--connect", f"tcp://127.0.0.1:{port}")
    assert res.code == 2 and res.out == "", (res.out, res.err)
    assert res.err == f"cis status: error: tcp://127.0.0.1:{port}: {said}" + res.err.split(said, 1)[1]
    assert len(res.err.strip().splitlines()) == 1


def test_the_launcher_does_not_take_another_process_at_a_nodes_address_for_ready():
    """A cluster started on the ports of one already running passed for ready (its status probes were answered by
    the old nodes); the status reply's pid tells them apart."""
    import subprocess
    import sys

    from cis.core.topologies import make_spec
    from cis.runtime.launcher import Cluster

    spec = make_spec("paper-7", "60-30-10")
    leaf = spec.nodes[-1].id
    with FakeNode() as squatter:  # a ROUTER answering every status, as another cluster's node would
        started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            cluster = Cluster("bundle", spec, {leaf: squatter.address}, procs={leaf: started})
            with pytest.raises(CisError, match=rf"node '{leaf}' at .*: process {os.getpid()} answers there, not the "
                                               rf"node started \(pid {started.pid}\)"):  # fmt: skip
                cluster.wait_ready(timeout=10, ids=[leaf])
        finally:
            started.kill()
            started.wait()


def test_status_takes_addresses_separated_by_commas_as_cis_infer_does(run_cli):
    from cis.runtime.launcher import free_port

    a, b = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    res = run_cli("status", "--connect", f"{a},{b}", "--timeout", "0.2", "--json")
    assert res.code == 1, res.err  # nobody answers: a row each, not an address error
    assert {k: v["live"] for k, v in json.loads(res.out)["nodes"].items()} == {a: False, b: False}
