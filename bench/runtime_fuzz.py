"""Fuzz a live ``cis serve --all`` cluster: malformed messages of many kinds to a leaf and to the root.

Every kind below is a way to get a message wrong, among them a type-confused
value of every header field (docs/protocol.md). Messages go through one DEALER
per target with a window of replies outstanding; kinds that the contract
answers with silence (a frame over --max-message-bytes: ZeroMQ drops the
connection) go one at a time through their own socket. Measured: node deaths
(restarts in the launcher's cluster.json, pids), messages without a reply,
reply codes per kind, ids echoed, RSS of the two nodes before, during and after.

    python -m bench.runtime_fuzz                  # 100,000 messages per target (leaf and root)
    python -m bench.runtime_fuzz --quick          # 5,000 per target
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import msgpack
import numpy as np
import zmq

from bench.harness import serve_command
from bench.runtime_live import add_live_args, live_bundle, machine, rss_mb, write_out
from cis.runtime import protocol as P

MAX_BYTES = 4 << 20  # --max-message-bytes of the fuzzed cluster: room for a too-large header frame
QUEUE_LIMIT = 1024
IN = (1, 8, 8)  # the digits input per sample
CONFUSED = [True, False, 1.5, -1, "1", b"1", [1], {"a": 1}, [], {}, None, msgpack.ExtType(5, b"x"), float("nan")]
VALID_FOR = {"deadline": (1.5,), "sender": ("1",), "node": ("1",), "route": ([],)}  # confusions that are not: left out
REQUIRED = ("v", "kind", "id")  # removing any other field leaves a valid message


def header(rid: int, n: int = 1, **fields) -> dict:
    h = {
        "v": 1,
        "kind": "infer",
        "id": rid,
        "names": ["input"],
        "dtypes": ["float32"],
        "shapes": [[n, *IN]],
        "stage": 1,
        "deadline": 0,
        "route": [],
        "sender": "fuzz",
        "node": "fuzz",
    }
    h.update(fields)
    return h


def pack(h: dict) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def x(n: int = 1) -> bytes:
    return np.zeros((n, *IN), np.float32).tobytes()


def confused(field: str):
    values = [
        v
        for v in CONFUSED
        if (v is not None or field in REQUIRED) and not any(v is w or v == w for w in VALID_FOR.get(field, ()))
    ]

    def make(rid, rng):
        value = values[int(rng.integers(len(values)))]
        h = header(rid)
        if value is None:
            h.pop(field)
        else:
            h[field] = value
        return [pack(h), x()]

    return make


def nonfinite(value: float):
    def make(rid, rng):
        a = np.zeros((3, *IN), np.float32)
        a[int(rng.integers(3)), 0, int(rng.integers(8)), int(rng.integers(8))] = value
        return [pack(header(rid, 3)), a.tobytes()]

    return make


def deep(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"  # arrays nested ``depth`` deep


# kind -> (frames maker, weight: share of the rotation, heavy kinds less often)
KINDS = {
    f"confused_{f}": (confused(f), 3)
    for f in ("v", "kind", "id", "names", "dtypes", "shapes", "stage", "deadline", "route", "sender", "node")
}
KINDS.update(
    {
        "random_bytes": (lambda rid, rng: [rng.bytes(int(rng.integers(1, 200)))], 3),
        "random_frames": (
            lambda rid, rng: [rng.bytes(int(rng.integers(0, 64))) for _ in range(int(rng.integers(2, 6)))],
            3,
        ),
        "empty_frame": (lambda rid, rng: [b""], 1),
        "header_array": (lambda rid, rng: [msgpack.packb([1, "infer", rid])], 1),
        "header_scalar": (lambda rid, rng: [msgpack.packb([rid, "x", None, 1.5][rid % 4])], 1),
        "header_truncated": (
            lambda rid, rng: (lambda b: [b[: int(rng.integers(1, len(b)))], x()])(pack(header(rid))),
            2,
        ),
        "header_bad_utf8": (lambda rid, rng: [b"\x82\xa1v\x01\xa4kind\xa5inf\xffr", x()], 1),
        "header_bin_keys": (
            lambda rid, rng: [msgpack.packb({b"v": 1, b"kind": b"infer", b"id": rid}, use_bin_type=True)],
            1,
        ),
        "header_deep": (lambda rid, rng: [b"\x83\xa1v\x01\xa4kind\xa5infer\xa5route" + deep(5000)], 1),
        "header_ext_type": (lambda rid, rng: [pack(header(rid, deadline=msgpack.Timestamp(0, 0))), x()], 1),
        "header_too_big": (lambda rid, rng: [pack(header(rid, pad="p" * (P.MAX_HEADER_BYTES + 10))), x()], 0.05),
        "frames_missing": (lambda rid, rng: [pack(header(rid))], 2),
        "frames_extra": (lambda rid, rng: [pack(header(rid)), x(), x(), b"zz"], 2),
        "frame_size_wrong": (
            lambda rid, rng: [pack(header(rid)), rng.bytes(int(rng.choice([*range(256), *range(257, 300)])))],
            3,
        ),
        "too_many_tensors": (
            lambda rid, rng: [
                pack(header(rid, names=[f"t{i}" for i in range(70)], dtypes=["uint8"] * 70, shapes=[[1]] * 70)),
                *([b"\x00"] * 70),
            ],
            0.5,
        ),
        "names_duplicate": (
            lambda rid, rng: [
                pack(header(rid, names=["input", "input"], dtypes=["float32"] * 2, shapes=[[1, *IN]] * 2)),
                x(),
                x(),
            ],
            1,
        ),
        "shape_declares_huge": (lambda rid, rng: [pack(header(rid, shapes=[[(1 << 31) - 1, (1 << 31) - 1]])), x()], 1),
        "stage_tensor_name": (lambda rid, rng: [pack(header(rid, names=["image"])), x()], 2),
        "stage_dtype": (lambda rid, rng: [pack(header(rid, dtypes=["float64"])), x() * 2], 2),
        "stage_shape": (
            lambda rid, rng: [pack(header(rid, shapes=[[1, 1, 8, 9]])), np.zeros((1, 1, 8, 9), np.float32).tobytes()],
            2,
        ),
        "stage_not_run_here": (lambda rid, rng: [pack(header(rid, stage=int(rng.integers(4, 256)))), x()], 2),
        "forward_extra_state": (
            lambda rid, rng: [
                pack(
                    header(
                        rid,
                        kind="forward",
                        names=["input", "patience_label", "patience_count"],
                        dtypes=["float32", "int64", "int64"],
                        shapes=[[1, *IN], [1], [1]],
                    )
                ),
                x(),
                bytes(8),
                bytes(8),
            ],
            1,
        ),
        "empty_batch": (lambda rid, rng: [pack(header(rid, 0)), b""], 2),
        "nan_input": (nonfinite(float("nan")), 2),
        "inf_input": (nonfinite(float("inf")), 2),
        "too_many_samples": (lambda rid, rng: [pack(header(rid, QUEUE_LIMIT + 1)), x(QUEUE_LIMIT + 1)], 0.2),
        "past_deadline": (
            lambda rid, rng: [pack(header(rid, deadline=time.time() - float(rng.uniform(0.001, 1e6)))), x()],
            2,
        ),
        "message_too_large": (
            lambda rid, rng: [
                pack(header(rid, names=["a", "b"], dtypes=["uint8"] * 2, shapes=[[3 << 20]] * 2)),
                bytes(3 << 20),
                bytes(3 << 20),
            ],
            0.05,
        ),
        "reply_kind_to_node": (
            lambda rid, rng: [pack({"v": 1, "kind": ["result", "error", "pong", "status_reply"][rid % 4], "id": rid})],
            2,
        ),
        "status_with_tensors": (lambda rid, rng: [pack(header(rid, kind="status")), x()], 1),
        "ping_with_tensors": (lambda rid, rng: [pack(header(rid, kind="ping")), x()], 1),
        "req_delimiter_garbage": (lambda rid, rng: [b"", rng.bytes(int(rng.integers(1, 50)))], 1),
    }
)
SILENT = {
    "frame_over_limit": lambda rid, rng: [
        pack(header(rid, shapes=[[(MAX_BYTES // 256) + 4, *IN]])),
        x((MAX_BYTES // 256) + 4),
    ]
}
EXPECTED = {  # the codes the contract gives (docs/protocol.md)
    **{
        f"confused_{f}": {c}
        for f, c in [
            ("v", "bad_version"),
            ("kind", "unknown_kind"),
            ("id", "bad_message"),
            ("stage", "bad_stage"),
            ("deadline", "bad_message"),
            ("route", "bad_message"),
            ("sender", "bad_message"),
            ("node", "bad_message"),
        ]
    },
    **{
        f"confused_{f}": {"bad_tensor", "bad_message"} for f in ("names", "dtypes", "shapes")
    },  # an empty array: counts differ
    "random_bytes": {"bad_message", "bad_version"},
    "random_frames": {"bad_message", "bad_version"},
    "header_truncated": {"bad_message"},
    "empty_frame": {"bad_message"},
    "header_array": {"bad_message"},
    "header_scalar": {"bad_message"},
    "header_bad_utf8": {"bad_message"},
    "header_bin_keys": {"bad_version"},
    "header_deep": {"bad_message"},
    "header_ext_type": {"bad_message"},
    "header_too_big": {"too_large"},
    "frames_missing": {"bad_message"},
    "frames_extra": {"bad_message"},
    "frame_size_wrong": {"bad_tensor"},
    "too_many_tensors": {"bad_message"},
    "names_duplicate": {"bad_tensor"},
    "shape_declares_huge": {"bad_tensor"},
    "stage_tensor_name": {"bad_tensor"},
    "stage_dtype": {"bad_tensor"},
    "stage_shape": {"bad_tensor"},
    "stage_not_run_here": {"bad_stage"},
    "forward_extra_state": {"bad_tensor"},
    "empty_batch": {"bad_tensor"},
    "nan_input": {"bad_input"},
    "inf_input": {"bad_input"},
    "too_many_samples": {"too_many_samples"},
    "past_deadline": {"deadline_exceeded"},
    "message_too_large": {"too_large"},
    "reply_kind_to_node": {"unknown_kind"},
    "status_with_tensors": {"bad_message"},
    "ping_with_tensors": {"bad_message"},
    "req_delimiter_garbage": {"bad_message", "bad_version"},
}
ID_UNREADABLE = {
    "random_bytes",
    "random_frames",
    "empty_frame",
    "header_array",
    "header_scalar",
    "header_truncated",
    "header_bad_utf8",
    "header_bin_keys",
    "header_deep",
    "header_too_big",
    "req_delimiter_garbage",
}


def schedule(n: int) -> list[str]:
    """Kinds in a weighted rotation, ``n`` in all."""
    names = list(KINDS)
    weights = np.array([KINDS[k][1] for k in names], float)
    counts = np.maximum(1, np.floor(n * weights / weights.sum())).astype(int)
    counts[0] += n - counts.sum()
    order = [k for k, c in zip(names, counts) for _ in range(c)]
    np.random.default_rng(0).shuffle(order)
    return order


class Tally:
    """The replies of one fuzzed node, matched to what was sent by request id, counted per kind and code."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.by_id: dict[int, str] = {}
        self.stats = {k: {"sent": 0, "replies_matched_by_id": 0, "codes": {}} for k in KINDS}
        self.unmatched: dict = {"replies": 0, "codes": {}}
        self.outstanding = self.replies = 0

    def receive(self, timeout_ms: int) -> bool:
        """Read every reply waiting (after up to ``timeout_ms`` for the first); False when none came."""
        if not self.sock.poll(timeout_ms):
            return False
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return True
            if frames and frames[0] == b"":  # our REQ-style delimiter echoed back
                frames = frames[1:]
            msg = P.decode(frames, kinds=P.REPLY_KINDS)
            self.outstanding -= 1
            self.replies += 1
            code = msg.header.get("code", msg.kind)
            kind = self.by_id.pop(msg.id, None)
            if kind is None:
                self.unmatched["replies"] += 1
                self.unmatched["codes"][code] = self.unmatched["codes"].get(code, 0) + 1
                continue
            s = self.stats[kind]
            s["replies_matched_by_id"] += 1
            s["codes"][code] = s["codes"].get(code, 0) + 1

    def result(self, sent: int, seconds: float) -> dict:
        id_less = sum(self.stats[k]["sent"] for k in (*ID_UNREADABLE, "confused_id"))
        echoed = all(s["replies_matched_by_id"] == s["sent"] for k, s in self.stats.items()
                     if k not in ID_UNREADABLE and k != "confused_id")  # fmt: skip
        return {"sent": sent, "replies": self.replies, "no_reply": sent - self.replies, "seconds": seconds,
                "every_readable_id_echoed": echoed, "id_less_sent": id_less, "id_less_replies": self.unmatched,
                "kinds": self.stats}  # fmt: skip


def fuzz_target(ctx: zmq.Context, addr: str, n: int, window: int, rng, progress) -> dict:
    """``n`` malformed messages of every kind (shuffled) to ``addr``, up to ``window`` without a reply."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = 0
    sock.connect(addr)
    tally = Tally(sock)
    t0 = time.perf_counter()
    sent = 0
    for i, kind in enumerate(schedule(n)):
        rid = 1000 + i
        if kind not in ID_UNREADABLE and kind != "confused_id":
            tally.by_id[rid] = kind
        sock.send_multipart(KINDS[kind][0](rid, rng), copy=True)
        tally.stats[kind]["sent"] += 1
        sent += 1
        tally.outstanding += 1
        while tally.outstanding >= window:
            if not tally.receive(10_000):
                break
        if i % 5000 == 0:
            progress(f"{addr}: {i}/{n} sent, {tally.replies} replies")
    end = time.monotonic() + 30
    while tally.outstanding > 0 and time.monotonic() < end:
        tally.receive(500)
    sock.close()
    return tally.result(sent, time.perf_counter() - t0)


def silent_kinds(ctx: zmq.Context, addr: str, n: int, rng) -> dict:
    """Frames over the limit: ZeroMQ drops the connection (no reply); the node must stay up and reachable."""
    got, t0 = 0, time.perf_counter()
    for i in range(n):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(addr)
        sock.send_multipart(SILENT["frame_over_limit"](i + 1, rng))
        got += bool(sock.poll(200))
        sock.close()
    return {"sent": n, "replies": got, "seconds": time.perf_counter() - t0}


def fuzz_node(ctx: zmq.Context, addr: str, pid: int, n: int, args: argparse.Namespace, rng) -> dict:
    """One target: a warm-up, then ``n`` malformed messages and the oversized ones, its RSS sampled every 0.25 s;
    what it counted, and whether it still serves."""
    from cis.runtime.client import Client

    fuzz_target(ctx, addr, 2000, args.window, rng, say)  # warm-up: the first RSS is taken after it
    rss0 = rss_mb(pid)
    with Client(addr) as c:
        errors0 = c.status()["errors"]
    peak, done = [rss0], threading.Event()

    def sample_rss() -> None:
        while not done.wait(0.25):
            peak.append(rss_mb(pid))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    res = fuzz_target(ctx, addr, n, args.window, rng, say)
    res["silent"] = silent_kinds(ctx, addr, args.silent, rng)
    done.set()
    sampler.join()
    with Client(addr, timeout=10) as c:
        st = c.status()
        ok = c.infer(np.zeros((4, *IN), np.float32))
    res.update({"rss_mb_before": rss0, "rss_mb_peak": max(peak), "rss_mb_after": rss_mb(pid),
                "node_errors_counted": st["errors"] - errors0, "errors_by_code": st["errors_by_code"],
                "undeliverable": st["undeliverable"], "serves_after": len(ok) == 4})  # fmt: skip
    res["rss_growth_mb"] = res["rss_mb_after"] - rss0
    return res


def fuzz_cluster(args: argparse.Namespace, bundle, work, n: int) -> tuple[dict, dict, dict, int]:
    """A leaf and the root of ``cis serve --all`` fuzzed in turn: (results per role, restarts, whether each kept
    its pid, the launcher's exit status)."""
    rng = np.random.default_rng(0)
    ctx = zmq.Context()
    node_args = ["--max-message-bytes", str(MAX_BYTES), "--queue-limit", str(QUEUE_LIMIT)]
    with serve_command(bundle, logs=work / "fuzz-logs", args=node_args) as cluster:
        targets = {
            "leaf": next(k for k, v in cluster.nodes.items() if v["exit"] == 1),
            "root": next(k for k, v in cluster.nodes.items() if v["parent"] is None),
        }
        pids = {role: cluster.pid(nid) for role, nid in targets.items()}
        results = {}
        for role, nid in targets.items():
            res = results[role] = {"node": nid, **fuzz_node(ctx, cluster.address(nid), pids[role], n, args, rng)}
            say(f"{role} ({nid}): {res['sent']} sent, {res['no_reply']} without reply, RSS {res['rss_mb_before']:.1f} "
                f"-> {res['rss_mb_after']:.1f} MB, {res['sent'] / res['seconds']:.0f} msg/s")  # fmt: skip
        restarts = {nid: s["restarts"] for nid, s in cluster.state().items()}
        same_pids = {role: cluster.pid(nid) == pids[role] for role, nid in targets.items()}
        code = cluster.stop()
    return results, restarts, same_pids, code


def summarise(results: dict, restarts: dict, same_pids: dict, code: int) -> dict:
    kinds_sent = {k for r in results.values() for k, s in r["kinds"].items() if s["sent"]} | set(SILENT)
    wrong = {
        role: {k: s["codes"] for k, s in r["kinds"].items() if set(s["codes"]) - EXPECTED[k]}
        for role, r in results.items()
    }
    for role, r in results.items():  # id-less replies: only codes some id-less kind may get
        allowed = set().union(*(EXPECTED[k] for k in (*ID_UNREADABLE, "confused_id")))
        if set(r["id_less_replies"]["codes"]) - allowed:
            wrong[role]["id_less"] = r["id_less_replies"]["codes"]
    return {
        "messages": sum(r["sent"] + r["silent"]["sent"] for r in results.values()),
        "kinds": len(kinds_sent),
        "node_deaths": sum(restarts.values()) + sum(not v for v in same_pids.values()),
        "without_reply": {role: r["no_reply"] for role, r in results.items()},
        "silent_kinds_answered": {role: r["silent"]["replies"] for role, r in results.items()},
        "rss_growth_mb": {role: round(r["rss_growth_mb"], 1) for role, r in results.items()},
        "every_readable_id_echoed": {role: r["every_readable_id_echoed"] for role, r in results.items()},
        "unexpected_codes": wrong,
        "launcher_exit": code,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000, help="malformed messages per target (leaf and root)")
    ap.add_argument("--silent", type=int, default=50, help="oversized-frame messages per target (documented silence)")
    ap.add_argument("--window", type=int, default=64, help="replies outstanding per target")
    add_live_args(ap, "runtime_fuzz", "5,000 messages per target")
    args = ap.parse_args()
    n = 5000 if args.quick else args.messages
    work, bundle = live_bundle(args)
    before_load = machine()
    results, restarts, same_pids, code = fuzz_cluster(args, bundle, work, n)
    summary = summarise(results, restarts, same_pids, code)
    out = {
        "summary": summary,
        "targets": results,
        "restarts": restarts,
        "machine_before": before_load,
        "machine_after": machine(),
        "command": "python -m bench.runtime_fuzz" + (" --quick" if args.quick else f" --messages {n}"),
    }
    write_out(args.out, out, report(out))
    say(json.dumps(summary))
    ok = (
        summary["node_deaths"] == 0
        and not any(summary["without_reply"].values())
        and max(summary["rss_growth_mb"].values()) < 50
    )
    return 0 if ok else 1


def say(m: str) -> None:
    print(f"runtime_fuzz: {m}", flush=True)


def report(out: dict) -> str:
    s, t = out["summary"], out["targets"]
    m0, m1 = out["machine_before"], out["machine_after"]
    lines = [
        "# Runtime fuzz: malformed messages to a live `cis serve --all` (digits bundle)",
        "",
        f"Command: `{out['command']}`. Machine: {m0['cpus']} CPUs, load average before {m0['loadavg_1_5_15']}, "
        f"after {m1['loadavg_1_5_15']} (shared and noisy).",
        "",
        f"- messages: {s['messages']:,} of {s['kinds']} kinds; node deaths: {s['node_deaths']}; launcher exit "
        f"{s['launcher_exit']}",
        f"- without a reply: {s['without_reply']} (oversized frames, documented silence, answered: "
        f"{s['silent_kinds_answered']})",
        f"- every readable id echoed: {s['every_readable_id_echoed']}; codes other than the contract's: "
        f"{s['unexpected_codes']}",
    ]
    for role, r in t.items():
        lines.append(
            f"- {role} ({r['node']}): {r['sent']:,} sent at {r['sent'] / r['seconds']:,.0f}/s; RSS "
            f"{r['rss_mb_before']:.1f} MB before, "
            f"{r['rss_mb_peak']:.1f} peak, {r['rss_mb_after']:.1f} after (growth {r['rss_growth_mb']:.1f} MB); "
            f"errors the node counted: {r['node_errors_counted']:,}"
        )
    lines += ["", "| kind | sent (leaf / root) | reply codes (leaf) |", "|---|---|---|"]
    leaf, root = t["leaf"]["kinds"], t["root"]["kinds"]
    for kind in leaf:
        codes = (
            ", ".join(f"{c} {n}" for c, n in sorted(leaf[kind]["codes"].items()))
            or "(id unreadable: matched by count, below)"
        )
        lines.append(f"| {kind} | {leaf[kind]['sent']} / {root[kind]['sent']} | {codes} |")
    lines.append(
        f"| frame_over_limit | {t['leaf']['silent']['sent']} / {t['root']['silent']['sent']} | no reply "
        f"(connection dropped), as documented |"
    )
    lines += [
        "",
        f"Replies with id 0 (the id could not be read), leaf: {t['leaf']['id_less_replies']['codes']}; "
        f"id-less messages sent: {t['leaf']['id_less_sent']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
