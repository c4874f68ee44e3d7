"""The bundles of the twin benchmarks (bench/twin_hard.py, bench/twin_spans.py), cached under ``--work``:

- :func:`wide_cloud_bundle`: an untrained ViT whose last stage is 14 blocks wide, its first two one block each
  (:func:`untrained_vit_bundle`, which bench/replicas.py's ViT uses too);
- :func:`digits_bundle`: the demo model, fp32 or int8 carries.

The twin's calibration itself is the simulator's: :mod:`cis.sim.twin_stages`, :mod:`cis.sim.twin_batches`,
:mod:`cis.sim.twin_calibration`.
"""

from __future__ import annotations

from pathlib import Path


def wide_cloud_bundle(work: Path, cifar: str) -> Path:
    """An untrained ViT (dim 128, 16 blocks) cut after blocks 1, 2 and 16: the cloud's stage is 14 blocks; int8
    carries (8 kB a forward instead of 33 kB: less copying on the shared core)."""
    arch = {"arch": "vit", "exits": [1, 2, 16], "dim": 128, "depth": 16, "heads": 4}
    return untrained_vit_bundle(work / "wide-cloud", cifar, arch, "0-0-100", val_size=200, latency_repeats=3,
                                note="untrained ViT with a wide last stage, for bench/twin_hard.py")  # fmt: skip


def untrained_vit_bundle(out: Path, cifar: str, arch: dict, serving: str, val_size: int, latency_repeats: int,
                         note: str) -> Path:  # fmt: skip
    """``out``/bundle: an untrained model of ``arch`` (seed 0) exported with int8 carries and its thresholds
    calibrated to paper-7 at ``serving``; made once, then read from the cache."""
    if (out / "bundle" / "manifest.json").is_file():
        return out / "bundle"
    import torch

    from bench.harness import ensure_cifar
    from cis.core.spec import spec_to_dict
    from cis.core.topologies import make_spec
    from cis.exporter import export_bundle
    from cis.training.architectures import build_model
    from cis.training.checkpoint import save_checkpoint
    from cis.training.data.loading import CIFAR10_MEAN, CIFAR10_STD

    torch.manual_seed(0)
    model = build_model(arch).eval()
    meta = {
        "classes": [str(i) for i in range(10)],
        "normalisation": {"mean": list(CIFAR10_MEAN), "std": list(CIFAR10_STD)},
        "dataset": f"cifar10:{ensure_cifar(Path(cifar))}",
        "seed": 0,
        "val_size": val_size,
        "spec": spec_to_dict(make_spec("paper-7", serving)),
        "note": note,
    }
    save_checkpoint(out / "run", model, meta)
    export_bundle(out / "run", out / "bundle", feature_dtype="int8", latency_repeats=latency_repeats)
    return out / "bundle"


def digits_bundle(work: Path, feature_dtype: str) -> Path:
    """The demo digits model (trained 300 steps), exported with ``feature_dtype`` carries."""
    out = work / f"digits-{feature_dtype}"
    if (out / "bundle" / "manifest.json").is_file():
        return out / "bundle"
    from cis.exporter import export_bundle
    from cis.exporter.fixture_bundle import make_demo_run

    run = work / "digits-run"
    if not (run / "meta.json").is_file() and not any(run.glob("*")):
        make_demo_run(run, steps=300)
    export_bundle(run, out / "bundle", feature_dtype=feature_dtype, latency_repeats=3)
    return out / "bundle"
