"""``cis rollout`` and what a hunt found (docs/runtime.md, *Updating a model*): Ctrl-C and SIGTERM roll back as a
failure does (exit 130, one line; a second Ctrl-C names what may be left); a load that passes ``--timeout`` is
waited for once more and dropped, or named when it still runs; the fit check takes a node's ``--threshold``, as
the node's own ``load`` does.

The nodes are real (``build_node``, as ``cis serve`` builds them: real sockets, real onnxruntime) but run in threads
of this process, so that a test can hold a node's load at a gate and signal the rollout at one of its lines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cis.core.bundle import MANIFEST, load_bundle  # noqa: E402
from cis.core.errors import CisError  # noqa: E402
from cis.core.spec import write_spec  # noqa: E402
from cis.runtime import protocol as P  # noqa: E402
from cis.runtime.client import Client  # noqa: E402
from cis.runtime.factory import build_node  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402
from cis.runtime.rollout import check_fits  # noqa: E402

NODES = ("cloud", "edge0", "device0")  # the rollout's order: parents first (load, switch), children first (drop)
BACK = "rolled back: every node serves the bundle it served before"


def _copy(src: Path, dst: Path, edit) -> Path:
    """A copy of bundle ``src`` whose manifest ``edit`` changed: the same stages, another bundle id."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    edit(manifest)
    (dst / MANIFEST).write_text(json.dumps(manifest))
    return dst


def _no_edge0_threshold(manifest: dict) -> None:
    del manifest["policy"]["thresholds"]["edge0"]
    manifest["nodes"]["edge0"].pop("threshold", None)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """(one, two, three): a small digits bundle; another export of it (its own id); one whose policy has no
    threshold for edge0 (a node then needs ``--threshold``)."""
    from cis.exporter.fixture_bundle import make_demo_bundle

    root = tmp_path_factory.mktemp("rollout-hunt")
    one = make_demo_bundle(root / "one", steps=20)
    two = _copy(one, root / "two", lambda m: m.update(created="2000-01-01T00:00:00+00:00"))
    return one, two, _copy(one, root / "three", _no_edge0_threshold)


class Tree:
    """cloud <- edge0 <- device0 of the bundle's spec at loopback ports, each node serving in a thread;
    ``thresholds``: a node's ``--threshold``."""

    def __init__(self, bundle: Path, folder: Path, thresholds: dict[str, float]):
        base = load_bundle(bundle).spec
        nodes = [dataclasses.replace(base.node(n), address=f"tcp://127.0.0.1:{free_port()}") for n in NODES]
        self.spec = base.replace_nodes(nodes)
        self.spec_file = folder / "spec.toml"
        write_spec(self.spec, self.spec_file)
        self.address = {n.id: n.address for n in nodes}
        self.nodes = {n: build_node(bundle, n, spec=self.spec, threshold=thresholds.get(n)) for n in NODES}
        self.stop, self.threads = threading.Event(), []
        for node in self.nodes.values():
            ready = threading.Event()
            kw = dict(install_signals=False, ready=ready.set, stop=self.stop.is_set)
            self.threads.append(threading.Thread(target=node.run, kwargs=kw, daemon=True))
            self.threads[-1].start()
            assert ready.wait(30)

    def status(self, nid: str) -> dict:
        with Client(self.address[nid]) as c:
            return c.status(timeout=10)

    def held(self) -> dict[str, tuple]:
        """Each node's (current bundle, bundles held, load in progress)."""
        return {n: (st["bundle"], [h["id"] for h in st["bundles"]], st["loading"]) for n in NODES
                for st in [self.status(n)]}  # fmt: skip

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


@pytest.fixture
def tree(tmp_path):
    made: list[Tree] = []

    def make(bundle: Path, thresholds: dict[str, float] | None = None) -> Tree:
        made.append(Tree(bundle, tmp_path, thresholds or {}))
        return made[-1]

    yield make
    for t in made:
        t.close()


@pytest.fixture
def at_line():
    """``at_line(start, action)``: ``action()`` runs once, inside the rollout's progress line that begins with
    ``start`` (cis rollout says them through logging). SIGINT is Python's Ctrl-C meanwhile."""
    hooks: list = []

    class Hook(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            for hook in [h for h in hooks if record.getMessage().startswith(h[0])]:
                hooks.remove(hook)
                hook[1]()

    logger, handler = logging.getLogger("cis.cli.commands.rollout"), Hook()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logger.addHandler(handler)
    yield lambda start, action: hooks.append((start, action))
    logger.removeHandler(handler)
    signal.signal(signal.SIGINT, before[0])
    assert not hooks, f"lines never said: {[h[0] for h in hooks]}"
    assert signal.getsignal(signal.SIGTERM) is before[1]  # cis rollout put its handler back


def ctrl_c() -> None:
    signal.raise_signal(signal.SIGINT)


def sigterm() -> None:
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would end the process: no roll-back"
    signal.raise_signal(signal.SIGTERM)


def _last(err: str) -> str:
    return err.strip().splitlines()[-1]


def test_ctrl_c_after_the_load_phase_rolls_back_and_exits_130(bundles, tree, at_line, run_cli):
    one, two, _ = bundles
    t, b1 = tree(one), load_bundle(one).id
    at_line("load:", ctrl_c)  # every node holds both bundles now
    r = run_cli("rollout", two, "--spec", t.spec_file)
    assert (r.code, r.out, _last(r.err)) == (130, "", f"cis rollout: interrupted; {BACK}"), r.err
    assert t.held() == {n: (b1, [b1], None) for n in NODES}


def test_sigterm_after_the_switch_phase_switches_every_node_back(bundles, tree, at_line, run_cli):
    one, two, _ = bundles
    t, b1 = tree(one), load_bundle(one).id
    at_line("switch:", sigterm)  # every node serves the new bundle now
    r = run_cli("rollout", two, "--spec", t.spec_file, "--json")
    assert (r.code, r.out, _last(r.err)) == (130, "", f"cis rollout: interrupted; {BACK}"), r.err
    assert t.held() == {n: (b1, [b1], None) for n in NODES}


def test_a_second_ctrl_c_stops_the_roll_back_and_says_what_may_be_left(bundles, tree, at_line, run_cli):
    one, two, _ = bundles
    t, b1, b2 = tree(one), load_bundle(one).id, load_bundle(two).id
    at_line("switch:", ctrl_c)
    at_line("rolling back:", ctrl_c)
    r = run_cli("rollout", two, "--spec", t.spec_file)
    assert r.code == 130 and _last(r.err) == (
        f"cis rollout: interrupted; interrupted again while rolling back: device0, edge0, cloud may still hold bundle "
        f"{b2} (those that switched serve it): switch them back and drop it with the 'switch' and 'drop' messages"
    ), r.err
    assert t.held() == {n: (b2, [b1, b2], None) for n in NODES}
    for n in NODES[::-1]:  # what the line says, children first
        with Client(t.address[n]) as c:
            c.control(P.SWITCH, bundle=b1)
            c.control(P.DROP, bundle=b2)
    _wait(lambda: t.held() == {n: (b1, [b1], None) for n in NODES})


def _wait(done, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < end, "not within 30 s"
        time.sleep(0.05)


def _gated(t: Tree, nid: str) -> threading.Event:
    """Hold node ``nid``'s loads until the returned event is set (then they run as ever)."""
    gate, real = threading.Event(), t.nodes[nid].updates.loader
    assert real is not None
    t.nodes[nid].updates.loader = lambda path: (gate.wait(60), real(path))[1]
    return gate


def test_a_load_past_the_timeout_is_waited_for_and_dropped(bundles, tree, at_line, run_cli):
    one, two, _ = bundles
    t, b1 = tree(one), load_bundle(one).id
    at_line("node cloud still loads", _gated(t, "cloud").set)  # the roll-back waits: let the load end now
    r = run_cli("rollout", two, "--spec", t.spec_file, "--timeout", "2")
    assert r.code == 2 and _last(r.err) == (
        f"cis rollout: error: node cloud at {t.address['cloud']} did not answer load within 2 s; {BACK}"), r.err
    assert t.held() == {n: (b1, [b1], None) for n in NODES}


def test_a_load_still_running_after_the_roll_back_is_named(bundles, tree, run_cli):
    one, two, _ = bundles
    t, b1, b2 = tree(one), load_bundle(one).id, load_bundle(two).id
    gate = _gated(t, "cloud")
    r = run_cli("rollout", two, "--spec", t.spec_file, "--timeout", "1")
    assert r.code == 2 and _last(r.err) == (
        f"cis rollout: error: node cloud at {t.address['cloud']} did not answer load within 1 s; rolled back, except: "
        f"node cloud still loads {two} after 1 s more: it will hold bundle {b2} beside its own; drop it then with the "
        "'drop' message"
    ), r.err
    assert t.held()["edge0"] == (b1, [b1], None) and t.held()["cloud"] == (b1, [b1], str(two))
    gate.set()  # the load ends: held, as the line says; the 'drop' message removes it
    _wait(lambda: t.held()["cloud"] == (b1, [b1, b2], None))
    with Client(t.address["cloud"]) as c:
        c.control(P.DROP, bundle=b2)
    _wait(lambda: t.held()["cloud"] == (b1, [b1], None))


def test_the_fit_check_takes_a_nodes_threshold_as_its_load_does(bundles, tree, run_cli):
    """``three`` has no threshold for edge0, which runs with --threshold 0.8: the node loads it (with 0.8), so the
    rollout's check lets it through; a node without one is refused, and told about --threshold."""
    one, _, three = bundles
    t, b3 = tree(one, {"edge0": 0.8}), load_bundle(three)
    assert t.status("edge0")["threshold_override"] == 0.8 and t.status("cloud")["threshold_override"] is None
    r = run_cli("rollout", three, "--spec", t.spec_file, "--json")
    assert r.code == 0, r.err
    assert r.json()["outcome"] == "done" and t.held() == {n: (b3.id, [b3.id], None) for n in NODES}
    assert t.status("edge0")["threshold"] == 0.8
    check_fits(b3, t.spec, {"edge0": 0.8, "cloud": None})
    with pytest.raises(CisError) as err:
        check_fits(b3, t.spec, {"edge0": None})
    assert "'edge0': the bundle's policy has no threshold for it" in str(err.value)
    assert "'cis serve --threshold T'" in str(err.value) and str(err.value).endswith("nothing was changed")


def test_a_bundle_whose_file_changed_is_one_line_that_says_nothing_was_changed(bundles, tmp_path, run_cli):
    """Every failure of the check phase ends the same way: a changed stage file (its sha256) included."""
    bad = tmp_path / "bad"
    shutil.copytree(bundles[0], bad)
    stage = next((bad / "stages").glob("*.onnx"))
    stage.write_bytes(stage.read_bytes() + b"\0")
    res = run_cli("rollout", bad, "--spec", tmp_path / "never-read.toml")
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and "sha256" in line and line.endswith("; nothing was changed"), res.err
