"""The public model path costs nothing: speed, graphs and memory (issue 32, "Speed and memory").

1. **Speed**: the built-in ResNet-18 built through the public path (this checkout: ``--method cis`` ->
   ``cis.training.models.model_ref.build_model`` -> the ``cis.training.architectures:resnet18`` factory) against
   the old path
   (a ``git archive`` of ``--baseline-ref``, default the merge-base with main: the registry's builder bounce ->
   ``cis.training.architectures.build_model``), the same ``cis.training.local.ExitSGDTrainer`` steps on
   CIFAR-shaped
   synthetic data. Each side runs in its own process (the baseline with ``PYTHONPATH`` on the archive), the
   two alternating, ``--repeats`` timed blocks each; images/s is the median. Target: within 2 %.
2. **Graphs**: the same model (seed 0) cut and exported per stage on both sides (torchscript, opset 17); the
   ONNX graphs compared node by node (op, inputs, outputs, attributes), and their initializers by value.
3. **Memory**: a user model from a file outside the repo (``PATH.py:make``, plain torch) trained by the
   engine as ``cis train`` runs it (paper-7, 7 nodes, each its own largest exit for J steps, Algorithm 1's
   aggregation) against a plain PyTorch loop over the same model (the same (exit, batch) steps on one model
   with one optimizer, no federation). Peak RSS above the process's RSS after imports and data, each in a
   fresh process. Target: within 1.2x. Models: ``cnn`` (activations dominate) and, with torchvision,
   ``resnet18`` cut with :func:`cis.training.models.backbone.with_exits` (weights dominate: the engine's global state,
   accumulator and one momentum buffer per node show).

    python -m bench.your_model_speed [--quick] [--repeats 5] [--baseline-ref main] [--threads 2]

Writes bench/results/your_model_speed.{json,md}. ``--quick`` is a smoke run (narrow model, few steps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, RESULTS, machine

CNN = '''
from torch import nn


def block(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, 1, 1),
                         nn.BatchNorm2d(o), nn.ReLU())


def head(c, num_classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def make(num_classes, input_shape, width=32):
    c, w = input_shape[0], width
    return [(block(c, w, 1), head(w, num_classes)), (block(w, 2 * w, 2), head(2 * w, num_classes)),
            (block(2 * w, 4 * w, 2), head(4 * w, num_classes))]
'''
RESNET = '''
from cis.training.models.backbone import torchvision_model, with_exits


def make(num_classes, input_shape):
    net = torchvision_model("resnet18", num_classes=num_classes)
    return with_exits(net, ["layer1", "layer2", "layer4"], num_classes, input_shape)
'''
MODELS = {"cnn": CNN, "resnet18": RESNET}


# ---------------------------------------------------------------- workers (run in their own process)


def _synthetic(n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _builtin_resnet(width: float):
    """The built-in ResNet-18 as ``--method cis`` builds it for CIFAR-10 (whatever path this checkout has)."""
    import numpy as np
    import torch

    from cis.training.builders import method_model
    from cis.training.config import make_config
    from cis.training.data.loading import Dataset

    x, y = _synthetic(64)
    train = Dataset(x.numpy(), y.numpy().astype(np.int64), [str(c) for c in range(10)], [0.0] * 3, [1.0] * 3,
                    "cifar10")
    config = make_config({}, {"dataset": "cifar10:/unused", "width": width, "seed": 0})
    torch.manual_seed(0)
    return method_model(config, 3, train)


def worker_speed(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from cis.training.federated import derived_generator
    from cis.training.local import Client, ExitSGDTrainer

    torch.set_num_threads(a.threads)
    model = _builtin_resnet(a.width)
    x, y = _synthetic(max(a.batch * 4, 256))
    client = Client("node", 0, 3, x, y)
    trainer = ExitSGDTrainer(lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=a.batch, steps=a.steps,
                             total_rounds=100)
    trainer.setup(model, [client])
    trainer.train(model, client, 3, 1, derived_generator(0, 1))  # warm-up
    rates, cpu_rates = [], []
    for r in range(a.blocks):
        t, c = time.perf_counter(), time.process_time()
        trainer.train(model, client, 3, r + 2, derived_generator(0, r + 2))
        rates.append(a.steps * a.batch / (time.perf_counter() - t))
        cpu_rates.append(a.steps * a.batch / (time.process_time() - c))
    import cis

    return {"images_per_s": rates, "images_per_cpu_s": cpu_rates, "code": str(Path(cis.__file__).parent.parent)}


def worker_graphs(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from cis.exporter.onnx_export import export_stage
    from cis.training.models.stage_plan import describe_stages, run_plan

    torch.set_num_threads(a.threads)
    plan = describe_stages(_builtin_resnet(a.width))
    feeds = plan.example_inputs(2, torch.Generator().manual_seed(0))
    outs, carry = run_plan(plan, feeds), dict(feeds)
    out = Path(a.out)
    for st, o in zip(plan.stages, outs):
        (out / f"stage{st.index}.onnx").write_bytes(export_stage(st, tuple(carry[n] for n in st.inputs))
                                                    .SerializeToString())
        carry = {n: o[n] for n in st.carry}
    return {"stages": len(plan.stages)}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker_memory(a: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS above the RSS after imports and data: the engine (``--mode engine``) or a plain loop."""
    import importlib.util

    import numpy as np
    import torch
    import torch.nn.functional as F

    from cis.core.topologies import make_spec
    from cis.training.config import make_config
    from cis.training.data.loading import Dataset, DataSplits
    from cis.training.data.partition import partition
    from cis.training.federated import derived_generator
    from cis.training.local import batch_indices
    from cis.training.run import build_setup

    torch.set_num_threads(a.threads)
    x, y = _synthetic(a.samples)
    xs, ys = x.numpy(), y.numpy().astype(np.int64)
    classes, spec = [str(c) for c in range(10)], make_spec("paper-7", "60-30-10", num_classes=10)
    parts = partition(ys, spec.nodes, "equal", seed=0)
    spec_ = importlib.util.spec_from_file_location("user_model", a.model_file)
    assert spec_ is not None and spec_.loader is not None
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    base = _rss_mb()
    if a.mode == "engine":
        data = Dataset(xs, ys, classes, [0.0] * 3, [1.0] * 3, "synthetic")
        config = make_config({}, {"model": f"{a.model_file}:make", "rounds": a.rounds, "batch_size": a.batch,
                                  "local_steps": a.steps, "serving": "60-30-10", "augment": False})
        s = build_setup(config, spec=spec, splits=DataSplits(data, data.subset(np.arange(64)), data))
        for _ in range(a.rounds):
            s.engine.run_round()
    else:  # one model, one optimizer, the engine's (exit, batch) steps
        stages = [torch.nn.ModuleDict({"body": b, "head": h}) for b, h in module.make(10, (3, 32, 32))]
        model = torch.nn.ModuleList(stages).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        for rnd in range(1, a.rounds + 1):
            for k, node in enumerate(spec.nodes):
                idx_all = torch.from_numpy(parts[node.id])
                for idx in batch_indices(len(idx_all), a.batch, a.steps, derived_generator(0, rnd, k + 1)):
                    carry, logits = x[idx_all[idx]], None
                    for st in stages[: node.exit]:
                        carry = st["body"](carry)
                    logits = stages[node.exit - 1]["head"](carry)
                    loss = F.cross_entropy(logits, y[idx_all[idx]])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"base_mb": base, "peak_mb": peak, "training_mb": peak - base}


WORKERS = {"speed": worker_speed, "graphs": worker_graphs, "memory": worker_memory}


# ---------------------------------------------------------------- the driver


def run_worker(kind: str, a: argparse.Namespace, code: Path | None, **extra: Any) -> dict[str, Any]:
    """This benchmark as a worker in a fresh process (``python -m bench.your_model_speed --worker``); ``code``: a
    baseline checkout first on PYTHONPATH (this checkout after it, for the bench package)."""
    argv = [sys.executable, "-m", "bench.your_model_speed", "--worker", kind, "--threads", str(a.threads),
            "--width", str(a.width), "--batch", str(a.batch), "--steps", str(a.steps), "--blocks", str(a.blocks)]
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=code or REPO)
    if done.returncode != 0:
        raise SystemExit(f"worker {kind} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def baseline_code(ref: str, into: Path) -> tuple[Path, str]:
    """The packages of ``ref`` (a git ref; ``merge-base`` = where this branch left main) unpacked into ``into``."""
    if ref == "merge-base":
        ref = subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True, text=True,
                             check=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "cis", "training", "export", "sim"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into, commit


def compare_graphs(a_dir: Path, b_dir: Path) -> dict[str, Any]:
    """Node by node (op, domain, inputs, outputs, attributes), initializers by value, graph inputs and outputs."""
    import onnx
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    for path in sorted(a_dir.glob("stage*.onnx")):
        ga, gb = onnx.load(str(path)).graph, onnx.load(str(b_dir / path.name)).graph
        nodes = [(n.op_type, n.domain, list(n.input), list(n.output), [x.SerializeToString() for x in n.attribute])
                 for n in ga.node]
        nodes_b = [(n.op_type, n.domain, list(n.input), list(n.output),
                    [x.SerializeToString() for x in n.attribute]) for n in gb.node]
        diff = next((i for i, (p, q) in enumerate(zip(nodes, nodes_b)) if p != q), None)
        inits_a = {t.name: numpy_helper.to_array(t) for t in ga.initializer}
        inits_b = {t.name: numpy_helper.to_array(t) for t in gb.initializer}
        same_inits = inits_a.keys() == inits_b.keys() and all(
            inits_a[k].dtype == inits_b[k].dtype and (inits_a[k] == inits_b[k]).all() for k in inits_a)
        io = [(v.name, v.type.SerializeToString()) for v in (*ga.input, *ga.output)]
        io_b = [(v.name, v.type.SerializeToString()) for v in (*gb.input, *gb.output)]
        out[path.stem] = {
            "nodes": len(nodes), "nodes_baseline": len(nodes_b), "first_differing_node": diff,
            "same_nodes": nodes == nodes_b, "initializers": len(inits_a), "same_initializers": same_inits,
            "same_inputs_outputs": io == io_b,
        }
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: narrow ResNet, few steps, 1 repeat")
    ap.add_argument("--repeats", type=int, default=5, help="alternating timed processes per side (default 5)")
    ap.add_argument("--baseline-ref", default="merge-base", help="git ref of the old path (default: the merge-base "
                    "of this branch with main; once merged, the main commit before the merge, e.g. 3c3876e)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=float, default=1.0, help="the built-in ResNet-18's width (default 1.0)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="SGD steps per timed block")
    ap.add_argument("--blocks", type=int, default=3, help="timed blocks per process")
    ap.add_argument("--models", default="cnn,resnet18", help="memory: user models (cnn, resnet18)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model-file", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2, help="memory: rounds (default 2)")
    ap.add_argument("--samples", type=int, default=1400, help="memory: synthetic training images (default 1400)")
    return ap.parse_args()


def speed(a: argparse.Namespace, base: Path) -> dict:
    """Images per second of the public path and the old one (``base``), alternating timed processes."""
    runs: dict[str, dict[str, list[float]]] = {"public": {}, "old": {}}
    for _ in range(a.repeats):  # alternating, so a load change hits both sides
        for side, code in (("public", None), ("old", base)):
            for key, values in run_worker("speed", a, code).items():
                if key != "code":
                    runs[side].setdefault(key, []).extend(values)
    med = {side: {k: statistics.median(v) for k, v in r.items()} for side, r in runs.items()}
    ratio = med["public"]["images_per_s"] / med["old"]["images_per_s"]
    return {"runs": runs, "median": med, "ratio": ratio, "within_2_percent": abs(ratio - 1) <= 0.02,
            "cpu_ratio": med["public"]["images_per_cpu_s"] / med["old"]["images_per_cpu_s"]}  # fmt: skip


def memory(a: argparse.Namespace, tmp_path: Path) -> dict:
    """Per user model: training memory of the engine against a plain loop."""
    out: dict[str, Any] = {}
    for name in a.models.split(","):
        if name == "resnet18":
            try:
                from cis.training.models.vision import import_torchvision

                import_torchvision()
            except ModuleNotFoundError:
                out[name] = "skipped: torchvision not installed"
                continue
        model_file = tmp_path / f"{name}.py"
        model_file.write_text(MODELS[name])
        runs = {mode: run_worker("memory", a, None, mode=mode, model_file=model_file, rounds=a.rounds,
                                 samples=a.samples) for mode in ("engine", "plain")}  # fmt: skip
        out[name] = {**runs, "ratio": runs["engine"]["training_mb"] / max(runs["plain"]["training_mb"], 1e-9),
                     "within_1_2x": runs["engine"]["training_mb"] <= 1.2 * runs["plain"]["training_mb"]}  # fmt: skip
    return out


def main() -> None:
    a = parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a)))
        return
    if a.quick:
        a.repeats, a.width, a.batch, a.steps, a.blocks, a.rounds, a.samples = 1, 0.125, 16, 2, 1, 1, 280
    result: dict[str, Any] = {"machine": machine(), "settings": {k: v for k, v in vars(a).items() if v is not None}}
    with tempfile.TemporaryDirectory(prefix="cis-your-model-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "base").mkdir()
        base, commit = baseline_code(a.baseline_ref, tmp_path / "base")
        if not (base / "training" / "builders.py").read_text().count("FAMILY_BUILDERS"):
            print(f"warning: {a.baseline_ref} ({commit[:12]}) already has the public path; pass --baseline-ref "
                  "with a commit from before it", file=sys.stderr)
        result["baseline"] = {"ref": a.baseline_ref, "commit": commit}
        result["speed"] = speed(a, base)
        for side, code in (("public", None), ("old", base)):
            (tmp_path / side).mkdir()
            run_worker("graphs", a, code, out=tmp_path / side)
        graphs = compare_graphs(tmp_path / "public", tmp_path / "old")
        result["graphs"] = {"stages": graphs, "identical": all(
            g["same_nodes"] and g["same_initializers"] and g["same_inputs_outputs"] for g in graphs.values())}
        result["memory"] = memory(a, tmp_path)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "your_model_speed" + ("_quick" if a.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{name}.md").write_text(report(result))
    print(report(result))


def report(r: dict[str, Any]) -> str:
    s, g = r["speed"], r["graphs"]
    lines = [
        "# Your model: the public path's cost (bench/your_model_speed.py)", "",
        f"Machine: {r['machine']['cpus']} CPUs, load {', '.join(f'{v:.1f}' for v in r['machine']['load_avg'])}; "
        f"settings {json.dumps({k: v for k, v in r['settings'].items() if k in ('quick', 'repeats', 'threads', 'width', 'batch', 'steps', 'blocks', 'rounds', 'samples')})}; "  # noqa: E501
        f"baseline {r['baseline']['ref']} = {r['baseline']['commit'][:12]} (git archive, first on PYTHONPATH).", "",
        "## Speed: built-in ResNet-18, public path vs old path", "",
        "| path | median images/s | median images per CPU second | blocks |", "|---|---|---|---|",
        *[f"| {label} | {s['median'][side]['images_per_s']:.1f} | {s['median'][side]['images_per_cpu_s']:.1f} | "
          f"{len(s['runs'][side]['images_per_s'])} |" for side, label in (
              ("public", "public (cis.training.models.model_ref -> cis.training.architectures:resnet18)"),
              ("old", "old (registry bounce -> architectures.build_model)"))], "",
        f"Ratio {s['ratio']:.4f} (wall): {'within' if s['within_2_percent'] else 'NOT within'} 2 %; per CPU second "
        f"{s['cpu_ratio']:.4f} (less sensitive to a shared machine's load).", "",
        "## Graphs: per-stage ONNX, node by node", "",
        "| stage | nodes | same nodes | same initializers | same inputs/outputs |", "|---|---|---|---|---|",
    ]
    for stage, d in g["stages"].items():
        lines.append(f"| {stage} | {d['nodes']} | {d['same_nodes']} | {d['same_initializers']} | "
                     f"{d['same_inputs_outputs']} |")
    lines += ["", f"Identical: {g['identical']}.", "", "## Memory: a user model, engine vs a plain PyTorch loop", "",
              "| model | engine MB | plain MB | ratio | within 1.2x |", "|---|---|---|---|---|"]
    for name, d in r["memory"].items():
        if isinstance(d, str):
            lines.append(f"| {name} | {d} | | | |")
            continue
        lines.append(f"| {name} | {d['engine']['training_mb']:.1f} | {d['plain']['training_mb']:.1f} | "
                     f"{d['ratio']:.2f} | {d['within_1_2x']} |")
    lines += ["", "MB: peak RSS above the RSS after imports and data (a fresh process each). The engine keeps the "
              "global state, one working model, an accumulator and one momentum buffer per node (Algorithm 1's "
              "state), and each node's data slice; the plain loop one model and one optimizer.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
