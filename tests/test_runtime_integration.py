"""The runtime with real processes on loopback, serving a small paper-7 digits bundle.

- ``cis serve --all`` serves the same shares per exit and the same accuracy as the
  offline CIS evaluation with the bundle's thresholds (same samples, same entry nodes);
- SIGKILL of the root under load loses no request (those after the kill are degraded)
  and forwarding resumes when the root is back;
- 10,000 malformed or random messages leave a node alive and answering;
- a client without an authorised CurveZMQ key gets no service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import start, started_nodes, stop  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.policy.exit_policy import assign_entries, evaluate_cis  # noqa: E402
from cis.core.spec import Node, write_spec  # noqa: E402
from cis.runtime import protocol as P  # noqa: E402
from cis.runtime.client import Client, infer_spread  # noqa: E402
from cis.runtime.launcher import free_port, launch  # noqa: E402
from cis.runtime.result_summary import summarize  # noqa: E402
from cis.runtime.security import CurveConfig, make_keys  # noqa: E402

FAST = ["--forward-timeout", "0.5", "--heartbeat", "0.1"]


def serve_through_leaves(bundle_dir, x) -> list:
    """Launch every node of the bundle's spec (no transfer caps), send each sample to the leaf
    that ``assign_entries`` gives it (the offline evaluation's flow), stop the nodes; the replies."""
    from cis.core.bundle import load_bundle
    from cis.core.policy.exit_policy import assign_entries
    from cis.runtime.launcher import launch

    spec = load_bundle(bundle_dir).spec
    cluster = launch(bundle_dir, spec, free_ports=True, extra_args=["--no-cap", *FAST])
    try:
        entries = assign_entries(spec, len(x), 0)
        clients = {nid: Client(cluster.addresses[nid], timeout=20) for nid in entries}
        try:
            results = infer_spread(clients, x, entries, window=8, timeout=20)
        finally:
            for c in clients.values():
                c.close()
    finally:
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes
    return results


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("runtime"), steps=300)


@pytest.fixture(scope="module")
def test_set():
    from cis.training.data.loading import load_dataset

    d = load_dataset("digits", seed=0).test
    return d.x, d.y


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of another parent still answers kill(0); check its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_serve_all_matches_offline_cis_evaluation(bundle_dir, test_set, tmp_path, run_cli):
    from cis.core.stages.runner import run_chain

    x, y = test_set
    bundle = load_bundle(bundle_dir)
    spec = bundle.spec
    offline = evaluate_cis(spec, run_chain(bundle, x), y, policy=bundle.policy)
    proc = start("serve", bundle_dir, "--all", "--free-ports", "--no-cap", "--json", *FAST)
    pids = []
    try:
        nodes = started_nodes(proc)
        pids = [v["pid"] for v in nodes.values()]
        assert set(nodes) == set(spec.ids)
        entries = assign_entries(spec, len(y), 0)
        clients = {nid: Client(nodes[nid]["address"], timeout=20) for nid in entries}
        try:
            results = infer_spread(clients, x, entries, window=8, timeout=20)
        finally:
            for c in clients.values():
                c.close()
        live = summarize(results, y)
        assert live["errors"] == {} and live["samples_answered"] == len(y) and live["degraded"] == 0, live
        for e, share in offline.exit_shares.items():
            assert abs(live["served_share_per_exit"].get(str(e), 0.0) - share) <= 0.02, (live, offline)
        assert abs(live["accuracy"] - offline.accuracy) <= 0.02
        # cis status over a spec that names the live addresses
        spec_file = tmp_path / "live.toml"
        write_spec(
            spec.replace_nodes(Node(**{**n.__dict__, "address": nodes[n.id]["address"]}) for n in spec.nodes), spec_file
        )
        st = run_cli("status", "--spec", spec_file, "--json")
        assert st.code == 0, st.err
        counters = st.json()["nodes"]
        assert sum(s["served"] for s in counters.values()) == len(y)
        assert counters[spec.root.id]["served"] == round(offline.exit_shares[3] * len(y))
    finally:
        stop(proc)
        for pid in pids:  # the launcher stopped every node
            end = time.monotonic() + 10
            while not _gone(pid) and time.monotonic() < end:
                time.sleep(0.05)
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"node pid {pid} outlived the launcher")
    assert proc.returncode == 0


def test_root_killed_under_load_loses_nothing_and_comes_back(bundle_dir, test_set):
    x, _ = test_set
    spec = load_bundle(bundle_dir).spec
    forced = {n.id: ["--threshold", "inf"] for n in spec.nodes if n.parent is not None}  # everything goes to the root
    cluster = launch(bundle_dir, spec, free_ports=True, extra_args=["--no-cap", *FAST], node_args=forced)
    root = spec.root.id
    try:
        leaf = spec.leaves[0].id
        rate, n = 100.0, 300
        kill_at = 1.0
        timer = threading.Timer(kill_at, cluster.kill, args=(root,))
        with Client(cluster.addresses[leaf], timeout=10) as c:
            timer.start()
            results = c.infer_many(
                x[:n].repeat(1, axis=0) if n <= len(x) else np.resize(x, (n, *x.shape[1:])),
                batch_size=1,
                rate=rate,
                timeout=10,
            )
        timer.join()
        assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
        exits = np.array([int(r.exit[0]) for r in results])
        degraded = np.array([bool(r.degraded[0]) for r in results])
        before = int(kill_at * rate * 0.8)
        after = int((kill_at + 0.1) * rate) + 5
        assert (exits[:before] == 3).all() and not degraded[:before].any()
        assert (exits[after:] < 3).all() and degraded[after:].all()
        assert ((exits == 3) | degraded).all()
        # the root comes back: forwarding resumes by itself
        cluster.start(root)
        cluster.wait_ready(30, ids=[root, *[n.id for n in spec.children(root)]])
        with Client(cluster.addresses[leaf], timeout=10) as c:
            end = time.monotonic() + 10
            while True:
                r = c.infer(x[:4])
                if (r.exit == 3).all() or time.monotonic() > end:
                    break
                time.sleep(0.1)
        assert (r.exit == 3).all() and not r.degraded.any()
    finally:
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes  # SIGTERM: drained and exited cleanly


def test_ten_thousand_bad_messages_leave_the_node_serving(bundle_dir, test_set):
    x, _ = test_set
    spec = load_bundle(bundle_dir).spec
    root = spec.root.id
    addr = f"tcp://127.0.0.1:{free_port()}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    proc = start("serve", bundle_dir, "--node", root, "--bind", addr, **quiet)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndhwm = s.rcvhwm = 20000
    try:
        with Client(addr, timeout=30) as c:
            c.status(timeout=30)
        s.connect(addr)
        rng = np.random.default_rng(0)
        header = P.encode(P.INFER, 1, {"input": x[:1]})[0]
        for i in range(10_000):
            k = i % 5
            if k == 0:
                frames = [rng.bytes(int(rng.integers(1, 64)))]
            elif k == 1:
                frames = [rng.bytes(8) for _ in range(int(rng.integers(1, 5)))]
            elif k == 2:
                frames = [
                    msgpack.packb(
                        {
                            "v": 1,
                            "kind": "infer",
                            "id": i,
                            "names": ["input"],
                            "dtypes": ["float32"],
                            "shapes": [[1, 9]],
                        }
                    ),
                    bytes(36),
                ]
            elif k == 3:
                frames = [header, rng.bytes(int(rng.integers(0, 300)))]
            else:
                frames = [msgpack.packb({"v": int(rng.integers(0, 3)), "kind": str(rng.integers(0, 9)), "id": -1})]
            s.send_multipart(frames)
        errors = replies = 0
        end = time.monotonic() + 20
        while replies < 10_000 and time.monotonic() < end:
            if s.poll(500):
                msg = P.decode(s.recv_multipart())
                replies += 1
                errors += msg.kind == P.ERROR  # random bytes of exactly the right size are a valid request
        assert errors >= 9_000  # answered with errors (a few may be valid by chance or dropped at the high-water mark)
        assert proc.poll() is None
        with Client(addr, timeout=10) as c:
            r = c.infer(x[:8])
        assert len(r) == 8 and (r.exit == 3).all()
    finally:
        s.close()
        assert stop(proc, 20) == 0  # SIGTERM: drained and exited cleanly (SIGKILLed after 20 s: fails)


def test_client_without_authorised_key_gets_no_service(bundle_dir, test_set, tmp_path):
    x, _ = test_set
    spec = load_bundle(bundle_dir).spec
    make_keys(tmp_path / "keys", "node")
    make_keys(tmp_path / "allow", "friend")
    make_keys(tmp_path / "other", "stranger")
    addr = f"tcp://127.0.0.1:{free_port()}"
    proc = start(
        "serve", bundle_dir, "--node", spec.root.id, "--bind", addr,
        "--curve-key", tmp_path / "keys" / "node.key_secret", "--allow", tmp_path / "allow",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    server = str(tmp_path / "keys" / "node.key")
    try:
        friend = CurveConfig(str(tmp_path / "allow" / "friend.key_secret"), None, server)
        with Client(addr, timeout=30, curve=friend) as c:
            c.status(timeout=30)
            assert (c.infer(x[:4]).exit == 3).all()
        stranger = CurveConfig(str(tmp_path / "other" / "stranger.key_secret"), None, server)
        for curve in (stranger, None):
            with Client(addr, timeout=1.5, curve=curve) as c:
                with pytest.raises(TimeoutError):
                    c.infer(x[:4])
        assert proc.poll() is None
    finally:
        stop(proc, 20)


def test_serve_all_with_curve_encrypts_and_authenticates_every_link(bundle_dir, test_set, tmp_path):
    """``--all --curve-key --allow``: the nodes share a key pair, which each node trusts besides its
    allow-list, so children reach their parents; a client with an allowed key gets answers from the root."""
    x, _ = test_set
    spec = load_bundle(bundle_dir).spec
    make_keys(tmp_path / "keys", "node")
    make_keys(tmp_path / "allow", "friend")
    proc = start(
        "serve", bundle_dir, "--all", "--free-ports", "--json", "--threshold", "inf", *FAST,
        "--curve-key", tmp_path / "keys" / "node.key_secret", "--allow", tmp_path / "allow",
    )  # fmt: skip
    try:
        nodes = started_nodes(proc)
        friend = CurveConfig(str(tmp_path / "allow" / "friend.key_secret"), None, str(tmp_path / "keys" / "node.key"))
        leaf = spec.leaves[0].id
        with Client(nodes[leaf]["address"], timeout=30, curve=friend) as c:
            end = time.monotonic() + 20
            while True:  # forwarding starts once the leaf's heartbeats reach its parent over Curve
                r = c.infer(x[:4])
                if not r.degraded.any() or time.monotonic() > end:
                    break
                time.sleep(0.2)
        assert (r.exit == 3).all() and not r.degraded.any(), (r.exit, r.served_by)
        assert set(r.served_by) == {spec.root.id}
    finally:
        stop(proc)


def test_serve_all_restarts_a_killed_node_and_status_shows_it(bundle_dir, test_set, tmp_path, run_cli):
    """``serve --all --log-dir --trust``: a signed bundle is served; a SIGKILLed node is reaped (no
    zombie) and restarted by the launcher, with its log and its restart count in ``cis status``."""
    import shutil

    from cis.core.bundle import sign_bundle
    from cis.core.signing import make_signing_key

    x, _ = test_set
    signed = tmp_path / "bundle"
    shutil.copytree(bundle_dir, signed)
    private, public = make_signing_key(tmp_path / "keys", "release")
    sign_bundle(signed, private)
    logs = tmp_path / "logs"
    proc = start("serve", signed, "--all", "--free-ports", "--json", "--log-dir", logs, "--trust", public, *FAST)
    try:
        nodes = started_nodes(proc)
        victim = next(nid for nid, v in nodes.items() if v["parent"] is not None and v["exit"] == 2)
        old = nodes[victim]["pid"]
        os.kill(old, signal.SIGKILL)
        state = {}
        end = time.monotonic() + 30
        while time.monotonic() < end:
            state = json.loads((logs / "cluster.json").read_text())["nodes"][victim]
            if state["restarts"] == 1 and state["state"] == "up":
                break
            time.sleep(0.05)
        assert state["restarts"] == 1 and state["pid"] != old and state["last_exit"] == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):  # reaped by the launcher: not even a zombie is left
            os.kill(old, 0)
        end = time.monotonic() + 30
        while True:
            st = run_cli("status", "--cluster", logs, "--json", "--timeout", "0.5")
            node = st.json()["nodes"][victim]
            if node["live"] or time.monotonic() > end:
                break
        assert node["live"] and node["restarts"] == 1 and node["launcher"]["restarts"] == 1, node
        assert st.code == 0 and "restarted" in (logs / f"{victim}.log").read_text()
        leaf = next(nid for nid in nodes if nodes[nid]["parent"] == victim)
        with Client(nodes[leaf]["address"], timeout=10) as c:
            assert len(c.infer(x[:4])) == 4
    finally:
        stop(proc)
    assert proc.returncode == 0
