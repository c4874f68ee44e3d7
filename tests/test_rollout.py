"""Updating a model on a running tree with real bundles and real node processes (docs/runtime.md, *Updating a model*).

Two trainings of the same digits model (same shapes, other weights): the issue's mixed tree is refused instead of
answered with the wrong weights; ``cis rollout`` moves a tree under load from one to the other, losing nothing and
answering every request with the bundle it entered with (its logits are that bundle's, to float precision); a
bundle that does not fit, an unsigned bundle where nodes trust a key, and a node killed mid-rollout each end in one
line and a clean rollback, or a finished rollout; SIGHUP reloads a node from its folder.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import read_until, start, stop  # noqa: E402

from cis.core.bundle import MANIFEST, load_bundle, sign_bundle  # noqa: E402
from cis.core.stages.runner import run_chain  # noqa: E402
from cis.runtime import protocol as P  # noqa: E402
from cis.runtime.client import Client, ServerError  # noqa: E402
from cis.runtime.launcher import ROLLOUT_FILE, free_port, launch  # noqa: E402
from cis.runtime.rollout import Rollout, spec_addresses, targets_of  # noqa: E402

FAST = ["--forward-timeout", "2", "--heartbeat", "0.1", "--no-cap"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """(bundle 1, bundle 2): the digits model trained twice (seeds 0 and 1), exported alike."""
    from cis.exporter.bundle_writer import export_bundle
    from cis.exporter.fixture_bundle import make_demo_bundle, make_demo_run

    root = tmp_path_factory.mktemp("rollout")
    one = make_demo_bundle(root / "one", steps=150)
    export_bundle(make_demo_run(root / "two" / "run", steps=150, seed=1), root / "two" / "bundle", latency_repeats=2)
    return one, root / "two" / "bundle"


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test.x


class Supervised:
    """A launched cluster whose dead nodes are restarted (what ``cis serve --all`` does every 0.1 s)."""

    def __init__(self, bundle, tmp_path, spec=None, **kw):
        self.spec = spec or load_bundle(bundle).spec
        self.log_dir = tmp_path / "logs"
        kw.setdefault("extra_args", FAST)
        self.cluster = launch(bundle, self.spec, free_ports=True, log_dir=str(self.log_dir), **kw)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._supervise, daemon=True)
        self.thread.start()

    def _supervise(self):
        while not self.done.wait(0.1):
            self.cluster.supervise()

    def statuses(self) -> dict[str, dict]:
        out = {}
        for nid, addr in self.cluster.addresses.items():
            with Client(addr) as c:
                out[nid] = c.status(timeout=10)
        return out

    def close(self):
        self.done.set()
        self.thread.join(5)
        codes = self.cluster.stop()
        assert all(code == 0 for code in codes.values()), codes


@pytest.fixture
def served(tmp_path):
    made = []

    def make(bundle, **kw):
        made.append(Supervised(bundle, tmp_path, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _load(cluster, x, n, rate, results, logits=True):
    """One client per leaf sending ``n`` one-sample requests at ``rate`` per second (threads); results by leaf."""

    def go(nid, addr):
        with Client(addr, timeout=20) as c:
            chunks = [x[i % len(x) : i % len(x) + 1] for i in range(n)]
            results[nid] = list(c.stream(chunks, window=32, rate=rate, timeout=20, logits=logits))

    leaves = [nid for nid in cluster.addresses if nid.startswith("device")]
    threads = [threading.Thread(target=go, args=(nid, cluster.addresses[nid])) for nid in leaves]
    for t in threads:
        t.start()
    return threads


def test_rollout_under_load_loses_nothing_and_answers_each_request_with_its_bundle(bundles, digits, served, run_cli,
                                                                                  tmp_path):  # fmt: skip
    """With two cloud replicas, each updated (a rollout targets every process; cluster.json follows)."""
    from cis.core.spec import write_spec

    one, two = bundles
    b1, b2 = load_bundle(one), load_bundle(two)
    spec = _with_cloud_replicas(b1.spec, 2)
    write_spec(spec, tmp_path / "spec.toml")
    s = served(one, spec=spec, spec_file=str(tmp_path / "spec.toml"))
    results: dict = {}
    threads = _load(s.cluster, digits, 240, 40.0, results)  # 4 leaves x 40 req/s for 6 s
    time.sleep(2.0)
    out = run_cli("rollout", two, "--cluster", s.log_dir, "--json")
    for t in threads:
        t.join(60)
    assert out.code == 0, out.err
    report = out.json()
    assert report["outcome"] == "done" and report["bundle"] == b2.id and set(report["previous"].values()) == {b1.id}
    assert sorted(report["nodes"]) == sorted(s.cluster.addresses)  # cloud#0 and cloud#1 among them
    offline = {b.id: run_chain(b, digits) for b in (b1, b2)}  # per exit (N, C) logits of each bundle
    seen = {b1.id: 0, b2.id: 0}
    for nid, rs in results.items():
        assert len(rs) == 240
        for i, r in enumerate(rs):
            assert r.error is None, (nid, i, r.error)
            assert not r.flags.any(), (nid, i)  # nothing degraded or capped: no carry ever met a missing bundle
            seen[r.bundle] += 1
            other = b2.id if r.bundle == b1.id else b1.id
            e, row = int(r.exit[0]), i % len(digits)
            assert np.allclose(r.logits[0], offline[r.bundle][e][row], atol=1e-4), (nid, i, r.bundle)
            assert not np.allclose(r.logits[0], offline[other][e][row], atol=1e-4), (nid, i)
    assert seen[b1.id] > 0 and seen[b2.id] > 0, seen  # the rollout happened under load
    for nid, st in s.statuses().items():
        assert st["bundle"] == b2.id and [h["id"] for h in st["bundles"]] == [b2.id], nid
        assert st["bundle_mismatch"] == {"refused": 0, "parent": 0}
    assert json.loads((s.log_dir / ROLLOUT_FILE).read_text())["id"] == b2.id
    assert s.cluster.serving() == str(Path(two).resolve())  # a node the launcher restarts now serves the new one
    status = run_cli("status", "--cluster", s.log_dir, "--json").json()
    assert {v["bundle"] for v in status["nodes"].values()} == {b2.id} and "cloud#1" in status["nodes"]
    end = time.monotonic() + 10  # the launcher's next look (every 0.1 s) rewrites cluster.json with the new bundle
    while json.loads((s.log_dir / "cluster.json").read_text())["bundle"] != str(Path(two).resolve()):
        assert time.monotonic() < end, "cluster.json still names the old bundle"
        time.sleep(0.1)


def _with_cloud_replicas(spec, count: int, port: int | None = None):
    """``spec`` with ``count`` replicas of its root; with ``port``, every node at a loopback address from it."""
    nodes = [dataclasses.replace(n, replicas=count if n.parent is None else 1,
                                 address=f"tcp://127.0.0.1:{port + 10 * i}" if port else None)
             for i, n in enumerate(spec.nodes)]  # fmt: skip
    return spec.replace_nodes(nodes)


def test_the_targets_of_a_spec_are_every_replica_at_its_address(bundles):
    spec = _with_cloud_replicas(load_bundle(bundles[0]).spec, 2, port=27600)
    targets = targets_of(spec, spec_addresses(spec))
    root = spec.root.id
    assert len(targets) == len(spec.nodes) + 1
    assert [(t.node, t.address, t.depth) for t in targets if t.node.startswith(root)] == [
        (f"{root}#0", "tcp://127.0.0.1:27600", 0), (f"{root}#1", "tcp://127.0.0.1:27601", 0)]  # fmt: skip


def _unfit(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose manifest lists two stages: no stage for the cloud's exit 3 (a manifest true to
    itself, the cloud cut from its nodes too: only the spec's cloud needs the third stage)."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["stages"] = manifest["stages"][:2]
    manifest["nodes"] = {nid: n for nid, n in manifest.get("nodes", {}).items() if n["exit"] <= 2}
    if isinstance(manifest["model"].get("exits"), list):  # the model record too: one exit per stage
        manifest["model"]["exits"] = manifest["model"]["exits"][:2]
    (dst / MANIFEST).write_text(json.dumps(manifest))
    return dst


def test_a_bundle_that_does_not_fit_the_spec_changes_nothing(bundles, served, run_cli, tmp_path):
    one, two = bundles
    bad = _unfit(Path(two), tmp_path / "two-stages")
    s = served(one)
    out = run_cli("rollout", bad, "--cluster", s.log_dir)
    assert out.code == 2 and out.out == ""
    line = out.err.strip().splitlines()[-1]
    assert "does not fit" in line and "cloud" in line and "nothing was changed" in line, out.err
    with Client(s.cluster.addresses["cloud"]) as c:  # and a node refuses it by itself too
        with pytest.raises(ServerError) as err:
            c.control(P.LOAD, timeout=60, path=str(bad))
    assert err.value.code == "bad_bundle" and "exit 3" in err.value.message
    b1 = load_bundle(one).id
    assert all([h["id"] for h in st["bundles"]] == [b1] for st in s.statuses().values())
    missing = run_cli("rollout", tmp_path / "nowhere", "--cluster", s.log_dir)
    assert missing.code == 2 and "no manifest.json" in missing.err


def test_an_unsigned_bundle_where_nodes_trust_a_key_rolls_back(bundles, served, run_cli, tmp_path):
    """device3 (loaded last) trusts a signing key; the others loaded the unsigned bundle before it refused: they drop
    it again and every node serves the signed one as before."""
    from cis.core.signing import make_signing_key

    one, two = bundles
    private, public = make_signing_key(tmp_path / "keys", "release")
    signed = tmp_path / "signed"
    shutil.copytree(one, signed)
    sign_bundle(signed, private)
    s = served(signed, node_args={"device3": ["--trust", str(public)]})
    out = run_cli("rollout", two, "--cluster", s.log_dir)
    assert out.code == 2, out.err
    line = out.err.strip().splitlines()[-1]
    assert "device3" in line and "not signed" in line and "rolled back" in line, out.err
    b1 = load_bundle(signed).id
    for nid, st in s.statuses().items():
        assert st["bundle"] == b1 and [h["id"] for h in st["bundles"]] == [b1], (nid, st["bundles"])
    assert not (s.log_dir / ROLLOUT_FILE).exists()
    here = run_cli("rollout", two, "--cluster", s.log_dir, "--trust", public)  # checked here first: nothing asked
    assert here.code == 2 and "not signed" in here.err


def test_a_node_killed_mid_rollout_is_brought_to_the_new_bundle(bundles, digits, served):
    one, two = bundles
    s = served(one)
    b2 = load_bundle(two)
    results: dict = {}
    threads = _load(s.cluster, digits, 160, 20.0, results, logits=False)
    time.sleep(1.0)

    def say(line: str) -> None:
        if line.startswith("load:"):  # every node holds both now: kill one before the switch
            s.cluster.kill("edge1")

    rollout = Rollout(b2, targets_of(s.spec, s.cluster.addresses), 60.0, log_dir=str(s.log_dir), say=say)
    try:
        report = rollout.run()
    finally:
        rollout.close()
    for t in threads:
        t.join(60)
    assert report["outcome"] == "done" and report["restarted"] == ["edge1"]
    for nid, st in s.statuses().items():
        assert st["bundle"] == b2.id and [h["id"] for h in st["bundles"]] == [b2.id], nid
    for nid, rs in results.items():  # every request got an answer (device2/3's forwards degraded while edge1 was down)
        assert len(rs) == 160 and all(r.error is None for r in rs), nid
        assert {r.bundle for r in rs} <= {load_bundle(one).id, b2.id}
    s.cluster.kill("device0")  # after the rollout, the launcher restarts a node with the new bundle
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            with Client(s.cluster.addresses["device0"]) as c:
                st = c.status(timeout=1)
            if st["restarts"] >= 1:
                break
        except TimeoutError:
            pass
    assert st["restarts"] >= 1 and st["bundle"] == b2.id


def test_sighup_reloads_a_node_from_its_folder(bundles, tmp_path):
    one, two = bundles
    folder = tmp_path / "served"
    shutil.copytree(one, folder)
    addr = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", folder, "--node", "cloud", "--bind", addr, "--log-format", "json")
    try:
        read_until(proc.stderr, proc, "node_start")
        b1, b2 = load_bundle(one).id, load_bundle(two).id
        shutil.rmtree(folder / "stages")
        (folder / MANIFEST).write_text("{")  # half-copied: the reload fails, the node serves as before
        proc.send_signal(signal.SIGHUP)
        read_until(proc.stderr, proc, "bundle_load_failed")
        with Client(addr) as c:
            assert c.status()["bundle"] == b1
        shutil.rmtree(folder)
        shutil.copytree(two, folder)
        proc.send_signal(signal.SIGHUP)
        read_until(proc.stderr, proc, "bundle_switched")
        with Client(addr) as c:
            st = c.status()
            x = np.zeros((1, 1, 8, 8), np.float32)
            assert c.infer(x).bundle == b2
        assert st["bundle"] == b2 and {h["id"]: h["state"] for h in st["bundles"]} == {b1: "retiring", b2: "current"}
    finally:
        code = stop(proc)
    assert code == 0


def test_the_issues_mixed_tree_is_degraded_not_wrong(bundles, digits, tmp_path):
    """cloud on one training, edge0 and device0 on the other (same shapes), every sample forced up: nothing is
    answered by the cloud (which would use other weights); the edge serves them, flagged degraded."""
    one, two = bundles
    addr = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("cloud", "edge0", "device0")}
    procs = [start("serve", one, "--node", "cloud", "--bind", addr["cloud"])]
    for nid, parent in (("edge0", "cloud"), ("device0", "edge0")):
        procs.append(start("serve", two, "--node", nid, "--bind", addr[nid], "--parent", addr[parent],
                           "--threshold", "inf", *FAST))  # fmt: skip
    try:
        for p in procs:
            read_until(p.stderr, p, "node_start")
        with Client(addr["device0"], timeout=30) as c, Client(addr["edge0"]) as e:
            end = time.monotonic() + 60
            while not (c.status()["parent_up"] and e.status()["parent_up"]) and time.monotonic() < end:
                time.sleep(0.1)
            rs = c.infer_many(digits[:40], batch_size=4, window=4)
            edge = e.status()
        served = {s for r in rs for s in r.served_by}
        assert served == {"edge0"} and all(r.degraded.all() for r in rs)
        assert {r.bundle for r in rs} == {load_bundle(two).id}
        assert edge["bundle_mismatch"]["parent"] >= 1
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0, 0, 0]


def test_a_new_launcher_serves_its_own_bundle_not_an_earlier_launchers_rollout(bundles, served, tmp_path):
    """LOG_DIR/rollout.json lasts one launcher: a `cis serve --all` started again with the same --log-dir serves
    the bundle it was given, not the one an earlier rollout left named there (found by a hunt: silently)."""
    from cis.core.spec import CisSpec, Node, validate

    one, two = bundles
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / ROLLOUT_FILE).write_text(json.dumps({"bundle": str(two)}))
    s = served(one, spec=validate(CisSpec((Node("cloud", 3),), 3, name="root")))
    assert not (logs / ROLLOUT_FILE).exists()
    assert {st["bundle"] for st in s.statuses().values()} == {load_bundle(one).id}
    assert json.loads((logs / "cluster.json").read_text())["bundle"] == str(one)
