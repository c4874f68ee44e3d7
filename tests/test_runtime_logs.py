"""What a node logs (docs/runtime.md, *Logs*), in-process with tiny numpy stages over real ZeroMQ: its
start, its parent going down and coming back, overload onset and end, a stage's traceback (rate-limited),
shutdown and stop; and the two line formats of cis.core.logs. Real processes are in test_ops_live.py."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections import namedtuple

import numpy as np
import pytest

from cis.core import logs
from cis.core.errors import CisError
from cis.runtime import events
from cis.runtime.client import Client, ServerError
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig

T = namedtuple("T", "name shape dtype")
IN, OUT = T("input", (None, 2), "float32"), T("logits", (None, 2), "float32")


class Stage:
    """logits = input (so [0, 0] is unsure and [9, 0] confident); raises on 999; optional delay."""

    inputs, outputs = (IN,), (OUT,)

    def __init__(self, delay: float = 0.0, carry: bool = False):
        self.delay = delay
        if carry:
            self.outputs = (OUT, IN)

    def run(self, feeds):
        x = feeds["input"]
        if (x == 999).any():
            raise RuntimeError("poisoned sample")
        if self.delay:
            time.sleep(self.delay)
        return {"logits": x, "input": x} if len(self.outputs) == 2 else {"logits": x}


class Running:
    def __init__(self, node: Node):
        self.node, self.stop = node, threading.Event()
        ready = threading.Event()
        kw = dict(install_signals=False, ready=ready.set, stop=self.stop.is_set)
        self.thread = threading.Thread(target=node.run, kwargs=kw, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def close(self):
        self.stop.set()
        self.thread.join(10)


def named(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def wait_for(caplog, name: str, timeout: float = 5.0) -> list[logging.LogRecord]:
    end = time.monotonic() + timeout
    while not named(caplog, name) and time.monotonic() < end:
        time.sleep(0.02)
    return named(caplog, name)


@pytest.fixture
def info(caplog):
    caplog.set_level(logging.INFO, logger="cis")
    return caplog


def test_start_parent_down_and_up_shutdown_and_stop(info):
    raddr, laddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    root = Running(Node(NodeConfig("root", 2, bind=raddr), {1: Stage(), 2: Stage()}))
    cfg = NodeConfig("leaf", 1, bind=laddr, parent=raddr, parent_id="root", threshold=0.9, heartbeat=0.05,
                     heartbeat_timeout=0.3)  # fmt: skip
    leaf = Running(Node(cfg, {1: Stage(carry=True)}))
    try:
        up = wait_for(info, "parent_up")
        assert up and up[0].fields == {"node": "leaf", "parent": "root", "address": raddr}
        starts = {r.fields["node"]: r for r in named(info, "node_start")}
        assert set(starts) == {"root", "leaf"} and starts["leaf"].levelno == logging.INFO
        assert starts["leaf"].fields["address"] == laddr and starts["leaf"].fields["parent"] == "root"
        assert f"node leaf (exit 1) at {laddr}, parent root at {raddr}" in starts["leaf"].getMessage()
        root.close()  # the parent goes away
        down = wait_for(info, "parent_down")
        assert down and down[0].levelno == logging.WARNING and "degraded" in down[0].getMessage()
        with Client(laddr, timeout=5) as c:
            assert c.infer(np.zeros((1, 2), np.float32)).degraded.all()
        root = Running(Node(NodeConfig("root", 2, bind=raddr), {1: Stage(), 2: Stage()}))
        end = time.monotonic() + 5
        while len(named(info, "parent_up")) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        assert "again after" in named(info, "parent_up")[1].getMessage()
    finally:
        leaf.close()
        root.close()
    stopping = [r for r in named(info, "shutdown") if r.fields["node"] == "leaf"]
    stopped = [r for r in named(info, "node_stop") if r.fields["node"] == "leaf"]
    assert len(stopping) == 1 and len(stopped) == 1 and stopped[0].fields["requests"] == 1
    assert len(named(info, "parent_down")) == 1  # a change of state, not a line per heartbeat


def test_overload_is_two_lines_however_many_requests_are_refused(info, monkeypatch):
    monkeypatch.setattr(events, "OVERLOAD_QUIET", 0.3)
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr, queue_limit=1), {1: Stage(delay=0.2)}))
    try:
        with Client(addr, timeout=5) as c:
            ids = [c.submit(np.zeros((1, 2), np.float32)) for _ in range(20)]
            codes = []
            end = time.monotonic() + 10
            while len(codes) < len(ids) and time.monotonic() < end:
                codes += [r.error.code if r.error else "ok" for _, r in c.poll(0.2)]
        assert codes.count("overloaded") >= 2
        assert len(wait_for(info, "overload_end", 3)) == 1
        (start,) = named(info, "overload_start")
        assert start.levelno == logging.WARNING and start.fields["limit"] == 1
        assert named(info, "overload_end")[0].fields["refused"] == codes.count("overloaded")
    finally:
        node.close()


def test_a_stage_failure_logs_its_traceback_once_per_period(info):
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr), {1: Stage()}))
    try:
        with Client(addr, timeout=5) as c:
            for _ in range(3):
                with pytest.raises(ServerError):
                    c.infer(np.full((1, 2), 999, np.float32))
    finally:
        node.close()
    (failed,) = named(info, "stage_failed")  # three failures within the period: one record
    assert failed.levelno == logging.ERROR and failed.exc_info and "poisoned sample" in failed.getMessage()
    assert "RuntimeError: poisoned sample" in logging.Formatter().formatException(failed.exc_info)


def _record(name: str = "parent_down", exc: bool = False) -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        info = sys.exc_info() if exc else None
    record = logging.LogRecord("cis.runtime.node", logging.WARNING, __file__, 1, "node leaf: parent down", None, info)
    record.event, record.fields = name, {"node": "leaf", "parent": "root"}
    return record


def test_json_lines_carry_the_event_its_fields_and_the_traceback():
    line = json.loads(logs.JsonFormatter().format(_record(exc=True)))
    assert line["event"] == "parent_down" and line["node"] == "leaf" and line["parent"] == "root"
    assert line["level"] == "WARNING" and line["logger"] == "cis.runtime.node" and line["time"].endswith("Z")
    assert line["message"] == "node leaf: parent down" and "ValueError: boom" in line["exc"]
    text = logs.TextFormatter().format(_record())
    assert text.split(" ", 1)[1] == "WARNING cis.runtime.node parent_down: node leaf: parent down"


def test_configure_sends_records_to_stderr_in_the_chosen_format(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    before = logs.current()
    try:
        logs.configure(logs.resolve("debug", "json"))
        logging.getLogger("cis.anything").debug("hello %s", "there")
        logging.getLogger("other.library").info("not shown: other libraries start at WARNING")
        (line,) = err.getvalue().splitlines()
        assert json.loads(line)["message"] == "hello there" and json.loads(line)["level"] == "DEBUG"
    finally:
        logs.configure(before)


def test_a_library_that_sets_its_own_logger_to_debug_still_shows_only_warnings(monkeypatch):
    """flwr sets DEBUG on its logger and prints through its own handler: logs.adopt routes it through ours, whose
    filter passes other libraries' records at WARNING and above, in the chosen format."""
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    before = logs.current()
    chatty = logging.getLogger("chatty.library")
    own = logging.StreamHandler(err)
    chatty.setLevel(logging.DEBUG)
    chatty.addHandler(own)
    try:
        logs.configure(logs.resolve("debug", "json"))
        logs.adopt("chatty.library")
        assert own not in chatty.handlers
        chatty.debug("not shown")
        chatty.info("not shown either")
        chatty.warning("shown")
        (line,) = err.getvalue().splitlines()
        assert json.loads(line)["message"] == "shown" and json.loads(line)["logger"] == "chatty.library"
    finally:
        chatty.removeHandler(own)
        chatty.setLevel(logging.NOTSET)
        logs.configure(before)


def test_the_flag_beats_the_variable_which_beats_the_default():
    env = {logs.ENV_LEVEL: "WARNING", logs.ENV_FORMAT: "json"}
    assert logs.resolve(None, None, {}) == logs.LogSettings("info", "text")
    assert logs.resolve(None, None, env) == logs.LogSettings("warning", "json")
    assert logs.resolve("debug", "text", env) == logs.LogSettings("debug", "text")
    with pytest.raises(CisError, match="CIS_LOG_FORMAT is 'yaml'; expected one of text, json"):
        logs.resolve(None, None, {logs.ENV_FORMAT: "yaml"})


def test_every_lets_one_through_per_period_and_counts_the_rest():
    every = logs.Every(10.0)
    assert every.due(0.0) == 0 and every.due(1.0) is None and every.due(2.0) is None
    assert every.due(10.0) == 2 and every.due(11.0) is None


def test_the_log_flags_parse_after_every_command_and_subcommand():
    """Issue 24: ``--log-level`` and ``--log-format`` on every command, after it too (``cis spec new --log-level``)."""
    import argparse

    from cis.cli.main import build_parser

    parser = build_parser()

    def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not subs:
            yield path
        for action in subs:
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))

    every = list(commands(parser))
    assert ("spec", "new") in every and ("serve",) in every
    for path in every:
        child = parser
        for name in path:
            child = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        flags = {f for a in child._actions for f in a.option_strings}
        assert {"--log-level", "--log-format"} <= flags, path
    args = parser.parse_args(["--log-level", "info", "spec", "new", "--log-level", "DEBUG", "-o", "x.toml"])
    assert args.log_level == "debug"
