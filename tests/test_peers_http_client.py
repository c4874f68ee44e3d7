"""Issue 34, the one-tier comparison's client: tritonclient's synchronous HTTP client with each request body made
once (bench/peers/loadgen.py ``OipHttp``, ``drive_sync``), the null endpoint that measures it alone
(bench/peers/null_oip.py), CPU per request on each side, and the README's sentence of goals met and missed.

- against the null endpoint, every request of a Poisson run is answered with the canned outputs, in JSON and with
  Triton's binary extension (a body made once per sample: the binary one carries its JSON part's size);
- against a real ``cis serve --node cloud --http-port`` the same samples give the same classes in JSON, in binary
  and over cis.Client: the prepared bodies say what the sample says;
- a refused request (an unknown model) is counted as refused, and the server keeps serving;
- the verdict names the goals missed as well as those met, with their ratios.

Skipped where tritonclient[http] is not installed (``pip install '.[peers]'``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")

REPO = Path(__file__).resolve().parents[1]

from bench.peers.loadgen import OipHttp, drive_sync, offsets_of  # noqa: E402
from bench.peers.systems import SingleServer, cis_node, cpu_seconds, oip_body, wait_http  # noqa: E402


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return Path(make_demo_bundle(tmp_path_factory.mktemp("peers-http"), steps=150))


@pytest.fixture(scope="module")
def null(tmp_path_factory):
    server = SingleServer("null", Path("unused"), tmp_path_factory.mktemp("null"))
    assert wait_http(f"{server.url}/v2/models/cis/infer", b"{}", 30, server.proc) is not None
    yield server
    server.stop()


@pytest.mark.parametrize("binary", [False, True])
def test_null_endpoint_answers_every_request(null, binary):
    x = np.random.default_rng(0).normal(size=(40, 3, 8, 8)).astype(np.float32)
    transport = OipHttp({"cloud": null.url}, binary=binary)
    body, json_size = transport.body(x[:1])
    assert (json_size is not None) == binary and len(body) > (json_size or 0)
    before = cpu_seconds([null.proc.pid])
    run = drive_sync(transport, x, ["cloud"] * len(x), offsets_of(200.0, len(x)), timeout=5.0, keep_answers=True)
    transport.close()
    s = run.summary()
    assert s["answered"] == s["requests"] == 40 and s["refused"] == s["timed_out"] == 0
    assert all(o.answer and o.answer["outputs"]["class"] == [3] for o in run.outcomes)
    assert cpu_seconds([null.proc.pid]) >= before


def _cis_node(bundle: Path):
    node = cis_node(bundle, "cloud", http=True)
    url = node.nodes["cloud"]["http"]
    if wait_http(f"{url}/v2/health/ready", None, 60, node.proc) is None:
        node.stop()
        pytest.fail("cis serve --node cloud --http-port gave no answer")
    return node, url


@pytest.mark.slow
def test_prepared_bodies_answer_what_cis_client_answers(demo_bundle):
    from cis.core.bundle import load_bundle
    from cis.runtime.client import Client

    shape = load_bundle(demo_bundle, verify=False).manifest["stages"][0]["inputs"][0]["shape"][1:]
    x = np.random.default_rng(1).normal(size=(12, *shape)).astype(np.float32)
    node, url = _cis_node(demo_bundle)
    try:
        with Client(node.nodes["cloud"]["address"], timeout=10) as c:
            want = [int(c.infer(x[i : i + 1]).cls[0]) for i in range(len(x))]
        for binary in (False, True):
            transport = OipHttp({"cloud": url}, binary=binary)
            run = drive_sync(transport, x, ["cloud"] * len(x), None, timeout=10.0, keep_answers=True)
            transport.close()
            assert [o.answer["outputs"]["class"][0] for o in run.outcomes if o.answer] == want
        bad = OipHttp({"cloud": url}, model="nope")
        run = drive_sync(bad, x[:2], ["cloud"] * 2, None, timeout=10.0)
        bad.close()
        assert [o.error for o in run.outcomes] == ["404", "404"]
        assert wait_http(f"{url}/v2/models/cis/infer", oip_body(x[:1]), 10, node.proc) is not None  # still serving
    finally:
        node.stop()


def test_verdict_names_goals_missed_and_met():
    from bench.peers.report import GOALS, verdict

    rows = {
        key: {"what": GOALS[key][0], "ratio": q, "goal": f"{GOALS[key][1]} {GOALS[key][2]}", "met": met}
        for key, q, met in (("p50_three_tiers", 0.18, True), ("door_p50_kserve", 0.59, False),
                            ("door_rate_kserve", None, None))
    }  # fmt: skip
    text = verdict(rows)
    met, missed = text.split("Goals missed:")
    assert "p50 through three tiers against Ray Serve 0.18x (<= 0.25)" in met
    assert "front door p50 against KServe (binary input) 0.59x (<= 0.5)" in missed
    assert "rate against KServe" not in text  # not measured: neither met nor missed


def test_peer_ahead_names_only_figures_where_the_peer_does_better():
    from bench.peers.report import GOALS, peer_ahead

    def row(key, ours, theirs):
        return {"what": GOALS[key][0], "cis": ours, "peer": theirs, "ratio": ours / theirs,
                "goal": f"{GOALS[key][1]} {GOALS[key][2]}", "met": None}  # fmt: skip

    assert peer_ahead({"door_p50_kserve": row("door_p50_kserve", 0.0026, 0.0047)}) == "none"  # missed, still ahead
    text = peer_ahead({"door_p50_mlserver": row("door_p50_mlserver", 0.004, 0.003),
                       "door_rate_kserve": row("door_rate_kserve", 300.0, 400.0)})  # fmt: skip
    assert "front door p50 against MLServer (JSON input): cis 4.00 ms, the peer 3.00 ms" in text
    assert "front door rate against KServe (binary input): cis 300/s, the peer 400/s" in text
