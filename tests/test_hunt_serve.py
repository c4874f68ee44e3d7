"""``cis serve`` (one node and ``--all``) against what a hunt for tracebacks and silent acceptance found:

- a Ctrl-C (SIGINT to the process group) while ``--all`` starts its nodes: no node traceback, the launcher
  stops the nodes and says 'interrupted' (status 130); a single node hit while it loads its stages says the same;
- a --parent ZeroMQ refuses (no tcp://), a TCP port past 65535, and --rcv-buf -5: one line each;
- --heartbeat, --forward-timeout, --max-wait, --threshold out of range (from a flag, a variable or the file);
- --all with --bind or --parent (per-node flags) is refused, not ignored; its nodes can read --threshold=-inf.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from cis.cli.commands import serve_config as options
from cis.core.errors import CisError
from cis.core.topologies import make_spec
from cis.runtime.addresses import connect
from cis.runtime.child_signals import sigint_blocked
from cis.runtime.launcher import Cluster, plan_addresses, plan_doors, plan_metrics
from cis.runtime.node_config import NodeConfig
from cis.runtime.upstream import Upstream

LINUX = sys.platform.startswith("linux")

# ---------------------------------------------------------------- values out of range: one line, status 2


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--heartbeat", "0", "a finite number of seconds > 0"),
        ("--heartbeat", "-1", "a finite number of seconds > 0"),
        ("--heartbeat", "nan", "a finite number of seconds > 0"),
        ("--forward-timeout", "0", "a finite number of seconds > 0"),
        ("--forward-timeout", "-1", "a finite number of seconds > 0"),
        ("--forward-timeout", "nan", "a finite number of seconds > 0"),
        ("--max-wait", "-1", "a finite number of seconds >= 0"),
        ("--max-wait", "nan", "a finite number of seconds >= 0"),
        ("--max-wait", "inf", "a finite number of seconds >= 0"),
        ("--threshold", "nan", "a confidence in [0, 1], or inf"),
        ("--threshold", "90", "a confidence in [0, 1], or inf"),
        ("--rcv-buf", "-5", "bytes >= 0, or -1"),
        ("--max-batch", "0", "an integer >= 1"),
        ("--metrics-port", "99999", "a port 0 (a free one) to 65535"),
        ("--http-port", "-1", "a port 0 (a free one) to 65535"),
        ("--bind", "tcp://127.0.0.1:99999", "tcp://HOST:PORT, PORT 1 to 65535"),
        ("--parent", "tcp://127.0.0.1:5555,tcp://127.0.0.1:99999", "tcp://HOST:PORT, PORT 1 to 65535"),
    ],
)
def test_a_flag_out_of_range_is_one_line(run_cli, flag, value, expected):
    r = run_cli("serve", "no-such-bundle", "--node", "cloud", flag, value)
    assert r.code == 2 and r.out == ""
    assert r.err.startswith(f"cis serve: error: argument {flag}: {value!r}; expected {expected}")
    assert r.err.endswith(" (see cis serve --help)\n") and r.err.count("\n") == 1


def test_the_same_ranges_hold_for_variables_the_file_and_deploy_sets(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_HEARTBEAT", "0")
    r = run_cli("serve", "no-such-bundle", "--node", "cloud")
    assert r.code == 2 and r.err == "cis serve: error: CIS_HEARTBEAT is '0'; expected a finite number of seconds > 0\n"
    monkeypatch.delenv("CIS_HEARTBEAT")
    conf = tmp_path / "serve.toml"
    conf.write_text('node = "cloud"\nmax_wait = nan\n')
    r = run_cli("serve", "no-such-bundle", "--config", conf)
    assert r.code == 2 and r.err.startswith(f"cis serve: error: {conf}: max_wait is nan; expected a finite number")
    with pytest.raises(CisError, match="--set heartbeat is '-1'; expected a finite number of seconds > 0"):
        options.option_text("heartbeat", "-1", "--set heartbeat")


def test_the_ranges_that_work_still_pass():
    from cis.cli.main import build_parser

    argv = ["serve", "b", "--node", "edge0", "--threshold", "inf", "--max-wait", "0", "--rcv-buf", "-1",
            "--heartbeat", "0.05", "--bind", "tcp://*:65535", "--parent", "tcp://a:1,tcp://b:2", "--metrics-port", "0"]
    args = build_parser().parse_args(argv)
    assert (args.threshold, args.max_wait, args.rcv_buf) == (math.inf, 0.0, -1)
    assert build_parser().parse_args(["serve", "b", "--threshold=-inf"]).threshold == -math.inf


def test_the_python_api_refuses_the_same_node_settings():
    for field, value in (("heartbeat", 0.0), ("forward_timeout", math.nan), ("max_wait", -1.0), ("rcv_buf", -5)):
        with pytest.raises(CisError, match=f"node x: {field} is .*; expected "):
            NodeConfig("x", 1, **{field: value})


# ---------------------------------------------------------------- addresses


def test_a_parent_zeromq_refuses_is_one_line_naming_node_and_address():
    cfg = NodeConfig("edge0", 2, parent="tcp://127.0.0.1:5555,127.0.0.1:5556", parent_id="cloud")
    up, ctx = Upstream(cfg, 0.0), zmq.Context()
    try:
        with pytest.raises(CisError) as got:
            up.open(ctx)
        assert str(got.value) == ("node edge0: parent 127.0.0.1:5556: not a ZeroMQ address (Invalid argument); "
                                  "expected tcp://HOST:PORT")  # fmt: skip
    finally:
        up.close()
        ctx.term()


def test_a_tcp_port_past_65535_is_refused_not_taken_modulo_65536():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        with pytest.raises(CisError, match=r"^tcp://127.0.0.1:99999: port past 65535; expected tcp://HOST:PORT"):
            connect(sock, "tcp://127.0.0.1:99999")
        assert sock.closed
    finally:
        ctx.term()


def test_all_gives_a_port_per_process_within_65535():
    spec = make_spec("paper-7", "60-30-10")
    addresses = plan_addresses(spec, free_ports=True)
    with pytest.raises(CisError, match=r"^metrics port 65533: process i of 7 gets port 65533\+i, up to 65539, past "
                                       r"65535; expected a port up to 65529"):  # fmt: skip
        plan_metrics(spec, addresses, 65533)
    with pytest.raises(CisError, match=r"^grpc port 65530: .* up to 65536"):
        plan_doors(spec, {"grpc": 65530})
    assert plan_metrics(spec, addresses, 65529)[0]["device3"] == 65535


@pytest.mark.parametrize("flag", ["--bind", "--parent"])
def test_all_refuses_the_per_node_address_flags(run_cli, flag):
    r = run_cli("serve", "no-such-bundle", "--all", flag, "tcp://127.0.0.1:5555")
    assert r.code == 2
    assert r.err == (f"cis serve: error: {flag} goes with --node; --all takes every node's address from the spec "
                     "(or --free-ports)\n")  # fmt: skip


def test_all_ignores_addresses_from_variables_as_it_ignores_their_node():
    from cis.cli.main import build_parser

    args = build_parser().parse_args(["serve", "b", "--all"])
    options.resolve(args, {"CIS_NODE": "edge0", "CIS_BIND": "tcp://127.0.0.1:5", "CIS_PARENT": "tcp://127.0.0.1:6"})
    assert (args.node, args.bind, args.parent) == (None, None, None)


# ---------------------------------------------------------------- Ctrl-C while starting


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_node_started_by_the_launcher_has_sigint_blocked():
    code = "print(next(l for l in open('/proc/self/status') if l.startswith('SigBlk')).split()[1])"
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with sigint_blocked():
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(child.stdout, 16) & (1 << (signal.SIGINT - 1))
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # ours is as it was


def test_wait_ready_gives_up_once_a_stop_was_asked_for():
    spec = make_spec("paper-7", "60-30-10")
    cluster = Cluster("bundle", spec, plan_addresses(spec, free_ports=True), stop_asked=lambda: True)
    with pytest.raises(KeyboardInterrupt):
        cluster.wait_ready(timeout=30)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("hunt-serve"), steps=20)  # started and stopped: never asked


def _serve(*args) -> subprocess.Popen:
    """``cis serve ARGS`` in a process group of its own (as a shell runs a job), stderr piped."""
    cmd = [sys.executable, "-m", "cis.cli.main", "serve", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _interrupt(proc: subprocess.Popen) -> tuple[int, str]:
    """Ctrl-C at the terminal: SIGINT to the whole process group. The exit status and stderr."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return proc.returncode, err


@pytest.mark.skipif(not LINUX, reason="finds the nodes with pgrep")
def test_ctrl_c_while_all_starts_its_nodes_stops_them_quietly(bundle_dir):
    spec_nodes = 7
    proc = _serve(bundle_dir, "--all", "--free-ports")
    nodes: list[int] = []
    end = time.monotonic() + 60
    while len(nodes) < spec_nodes and proc.poll() is None and time.monotonic() < end:
        nodes = _children(proc.pid)  # every node started, none ready yet (they import and load their stages)
        time.sleep(0.01)
    code, err = _interrupt(proc)
    assert len(nodes) == spec_nodes, err
    assert code == 130 and err.endswith("cis serve: interrupted\n"), err
    assert "Traceback" not in err and "Fatal Python error" not in err and "exited with status" not in err, err
    for pid in nodes:  # the launcher stopped and reaped them
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ctrl_c_while_one_node_loads_its_stages_waits_for_them_then_is_interrupted(bundle_dir, run_cli, monkeypatch):
    """A KeyboardInterrupt thrown into the loading (onnxruntime's import turns it into an ImportError traceback)
    becomes a request to stop: the stages load, the node does not serve, and main says 'interrupted'."""
    from cis.cli.commands import serve

    loaded = []

    class Unserved:
        def run(self, **_):
            raise AssertionError("a node asked to stop while it loaded must not serve")

    def build(*_):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of loading the stages
        loaded.append(True)
        return Unserved()

    monkeypatch.setattr(serve, "_build", build)
    before = signal.getsignal(signal.SIGINT)
    r = run_cli("serve", bundle_dir, "--node", "cloud", "--bind", "tcp://127.0.0.1:1")
    assert loaded == [True] and (r.code, r.err) == (130, "cis serve: interrupted\n")
    assert signal.getsignal(signal.SIGINT) is before  # cis serve put the handler back


def test_all_passes_a_threshold_of_minus_inf_as_its_nodes_can_read_it():
    from cis.cli.commands import serve
    from cis.cli.main import build_parser

    args = build_parser().parse_args(["serve", "b", "--all", "--threshold=-inf"])
    options.resolve(args, {})
    given = {}

    def start(*positional, **_):
        given.update(positional[5])  # node_args
        raise KeyboardInterrupt  # nothing to start here

    args.start_cluster = start
    with serve.StopAsked() as stop, pytest.raises(KeyboardInterrupt):
        serve._run_all(args, make_spec("paper-7", "60-30-10"), stop)
    node = build_parser().parse_args(["serve", "b", "--node", "edge0", *given["edge0"]])
    assert node.threshold == -math.inf


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory):
    pytest.importorskip("onnx")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("fit"), steps=20)


def _moved_device(spec):
    """device0 moved to exit 2 under the cloud: the bundle's threshold for it was calibrated at exit 1."""
    import dataclasses

    return spec.replace_nodes(dataclasses.replace(n, exit=2, parent="cloud") if n.id == "device0" else n
                              for n in spec.nodes)  # fmt: skip


def test_serve_refuses_a_spec_the_bundle_does_not_fit_as_deploy_does(demo_bundle, run_cli, tmp_path):
    """Found by a hunt: serve --all served device0 at exit 2 with the threshold calibrated for exit 1, and a
    2-exit spec on a 3-stage bundle (its root answering at exit 2); deploy refused both."""
    from cis.core.bundle import load_bundle
    from cis.core.spec import write_spec
    from cis.runtime.factory import fit

    bundle = load_bundle(demo_bundle)
    moved = _moved_device(bundle.spec)
    with pytest.raises(CisError, match="node 'device0': exit 2 in the spec, but the bundle's threshold for it was"):
        fit(bundle, moved, "device0")
    assert fit(bundle, moved, "device0", threshold=0.5) == 0.5  # a threshold of its own: the operator's choice
    write_spec(moved, tmp_path / "moved.toml")
    r = run_cli("serve", demo_bundle, "--all", "--spec", tmp_path / "moved.toml", "--free-ports")
    assert r.code == 2 and "calibrated at exit 1" in r.err
    from cis.core.spec import CisSpec, Node, validate

    two = validate(CisSpec((Node("cloud", 2), Node("device0", 1, parent="cloud", arrival_rate=10.0)), 2))
    with pytest.raises(CisError, match="2 exits, but the bundle has 3 stages"):
        fit(bundle, two, "cloud")
