"""The small fleet defects of the fleet hunt (its finding 8), each said plainly and exactly: a control message
that times out, ``cis infer``'s retry and timeout flags (and ``cis bench --timeout``), ``Client(retry_after=)``,
the bundle in ``node_start``, a replica that cannot bind, and a load of a bundle the node holds already (a SIGHUP
of a folder that did not change). Real sockets and a real node (tiny numpy stages)."""

from __future__ import annotations

import logging

import pytest
import zmq
from test_runtime_updates import A, B, Running, stages, version

from cis.core.errors import CisError
from cis.runtime import events
from cis.runtime import protocol as P
from cis.runtime.client import Client
from cis.runtime.front_socket import bind_front
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig

NOWHERE = "tcp://127.0.0.1:1"  # nothing listens: the checks come before anything is sent


def test_a_control_message_without_an_answer_times_out_in_plain_words():
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with Client(address) as c:
        with pytest.raises(TimeoutError) as err:
            c.control(P.LOAD, timeout=0.2, path="/bundles/b")
        assert str(err.value) == f"no answer to load from {address} within 0.2 s"
        with pytest.raises(TimeoutError) as err:
            c.control(P.STATUS, timeout=0.2)
        assert str(err.value) == f"no status from {address} within 0.2 s"


@pytest.mark.parametrize(("flags", "said"), [
    (("--retry-after", "nan"), "--retry-after is nan; expected seconds > 0 and finite (or --no-retry)"),
    (("--retry-after", "inf"), "--retry-after is inf; expected seconds > 0 and finite (or --no-retry)"),
    (("--retry-after", "0"), "--retry-after is 0; expected seconds > 0 and finite (or --no-retry)"),
    (("--timeout", "inf"), "--timeout is inf; expected seconds > 0 and finite"),
    (("--retry-after", "2", "--no-retry"), "argument --no-retry: not allowed with argument --retry-after"),
    (("--no-retry", "--retry-after", "3"), "argument --retry-after: not allowed with argument --no-retry"),
])  # fmt: skip
def test_infer_refuses_retry_and_timeout_flags_that_cannot_work_in_its_own_line(flags, said, run_cli):
    res = run_cli("infer", "--connect", NOWHERE, "--dataset", "digits", *flags)
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith(f"cis infer: error: {said}"), res.err


def test_bench_refuses_an_infinite_timeout_in_its_own_line(run_cli):
    res = run_cli("bench", NOWHERE, "--rate", "1", "--requests", "1", "--timeout", "inf")
    lines = res.err.strip().splitlines()
    assert res.code == 2 and lines == ["cis bench: error: --timeout inf: expected seconds > 0 and finite"], res.err


@pytest.mark.parametrize("retry_after", [float("inf"), float("nan")])
def test_the_client_says_retry_after_must_be_finite(retry_after):
    with pytest.raises(CisError) as err:
        Client(NOWHERE, retry_after=retry_after)
    assert str(err.value) == (f"Client: retry_after is {retry_after!r}; expected seconds >= 0 and finite (None or 0: "
                              "no retries)")  # fmt: skip


def test_node_start_names_the_bundle_by_its_id(caplog):
    cfg = NodeConfig("cloud", 3, bundle="/srv/bundle", bundle_sha256=A)
    with caplog.at_level(logging.INFO, logger="cis.runtime.node"):
        events.started(cfg, None)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("node cloud ")]
    assert record.getMessage().endswith(f"(root); bundle {A[:16]} (/srv/bundle)")
    assert "sha256" not in record.getMessage()


def test_a_replica_that_cannot_bind_names_itself():
    ctx = zmq.Context.instance()
    taken = ctx.socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(CisError) as err:
            bind_front(ctx, NodeConfig("cloud", 3, bind=f"tcp://127.0.0.1:{port}", name="cloud#1"))
    finally:
        taken.close(0)
    assert str(err.value).startswith(f"node cloud#1: cannot bind tcp://127.0.0.1:{port} (Address already in use)")


def test_a_load_of_a_bundle_the_node_holds_says_nothing_changed_not_beside_none(caplog):
    """A reload of the node's own folder (what SIGHUP does) that still holds the bundle it serves; then a new
    bundle, and that one again."""
    address = f"tcp://127.0.0.1:{free_port()}"
    node = Node(NodeConfig("root", 2, bind=address, bundle="/bundles/a", bundle_sha256=A), stages(2))
    node.updates.loader = lambda path: version(B if path.endswith("b") else A, 1)
    running = Running(node)
    try:
        with caplog.at_level(logging.INFO, logger="cis.runtime.node"), Client(address, timeout=5) as c:
            c.control(P.RELOAD, timeout=5)  # no path: the node's own folder, as on SIGHUP
            c.control(P.LOAD, timeout=5, path="/bundles/b")
            assert c.control(P.LOAD, timeout=5, path="/bundles/b")["bundle"] == A[:16]
    finally:
        running.close()
    said = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "bundle_loaded"]
    assert said == [
        f"node root: /bundles/{A[:16]} is bundle {A[:16]}, the one it serves; nothing changed",
        f"node root: loaded bundle {B[:16]} (/bundles/{B[:16]}) beside {A[:16]}",
        f"node root: /bundles/{B[:16]} is bundle {B[:16]}, which it holds already beside {A[:16]} (the one it "
        "serves); it stays held",
    ]
