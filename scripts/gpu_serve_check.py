"""The GPU tier serving on a GPU (issue 24, item 8): the cloud tier of a real bundle under ``cis serve --provider
cuda`` and ``--provider auto``, with ``cis infer`` through it; what runs the stages, accuracy and latency, and the
bundle's CUDA latency profile. Run by scripts/gpu_serve_check.sh on a GPU machine (after onnxruntime-gpu is
installed from parts); rehearsed on a CPU with ``--provider cpu``.

    python3 scripts/gpu_serve_check.py --out /tmp/cis-gpu-serve [--provider cuda] [--n 300]

Writes OUT/serve.json and prints one line per serve; exits 1 when a serve did not run its stages where asked.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cis.runtime.ports import free_port  # noqa: E402

NODE = "cloud"  # the root of the demo's paper-7 spec: exit 3, every stage


def cis(*args: str) -> list[str]:
    return [sys.executable, "-m", "cis.cli.main", *args]


def start_line(proc: subprocess.Popen, timeout: float = 180) -> dict:
    """The node's node_start record (JSON log lines on its stderr)."""
    text, end = "", time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < end:
        if select.select([proc.stderr], [], [], 0.5)[0]:
            chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
            if not chunk:
                break
            text += chunk
            for line in text.splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "node_start":
                    return json.loads(line)
        elif proc.poll() is not None:
            break
    raise RuntimeError(f"no node_start (exit {proc.poll()}): {text[-2000:]}")


def serve_once(bundle: Path, provider: str, n: int) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    argv = cis("--log-format", "json", "serve", str(bundle), "--node", NODE, "--bind", address, "--provider",
               provider, "--metrics-port", "0")  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        started = start_line(proc)
        infer = subprocess.run(cis("infer", "--connect", address, "--dataset", "digits", "--n", str(n), "--json"),
                               capture_output=True, text=True, timeout=300)  # fmt: skip
        if infer.returncode != 0:
            raise RuntimeError(f"cis infer: {infer.stderr[-2000:]}")
        with urllib.request.urlopen(started["metrics"], timeout=10) as r:
            info = [line for line in r.read().decode().splitlines() if line.startswith("cis_node_info{")]
        result = json.loads(infer.stdout)
        return {
            "provider": provider,
            "backend": started["backend"],
            "node_info": info,
            "accuracy": result.get("accuracy"),
            "latency": result.get("latency"),
            "errors": result.get("errors"),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/cis-gpu-serve"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/cis-gpu-serve-work"), help="the demo bundle's folder")
    parser.add_argument("--provider", default="cuda", help="what --provider to ask first (auto follows); cpu rehearses")
    parser.add_argument("--n", type=int, default=300, help="digits test samples sent through the tier")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    from cis.core.bundle import load_bundle
    from cis.exporter.fixture_bundle import make_demo_bundle

    summary: dict = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
    try:
        import torch

        summary["torch"] = torch.__version__
        summary["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        summary["torch"] = None
    # exported here (a CUDA latency profile where CUDA runs), outside --out: a call brings back 8 files at most
    bundle = make_demo_bundle(args.work / "demo", steps=150)
    try:
        summary["cuda_latency_profile"] = load_bundle(bundle).latency_profile("cuda")
    except Exception as exc:  # the bundle says which profiles it has
        summary["cuda_latency_profile"] = f"none: {exc}"
    summary["serves"] = [serve_once(bundle, p, args.n) for p in dict.fromkeys([args.provider, "auto"])]
    (args.out / "serve.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    ok = True
    for s in summary["serves"]:
        print(f"--provider {s['provider']}: stages on {s['backend']}; accuracy {s['accuracy']}; "
              f"p50 {s['latency'] and s['latency'].get('p50_s')} s; errors {s['errors']}")  # fmt: skip
        wanted = "CPUExecutionProvider" if args.provider == "cpu" else "CUDAExecutionProvider"
        ok &= wanted in s["backend"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
