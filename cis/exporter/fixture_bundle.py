"""The test fixture: a small trained run dir (and its bundle) without the federated trainer, for tests and examples.

``make_demo_run(run_dir)`` trains the digits CNN centrally for a few hundred
steps (seconds on a CPU) so its confidences mean something, and saves it in the
trainer's checkpoint format with a paper-7 spec in its metadata. Tests of the
exporter, the runtime and the simulator use it to get a real bundle quickly:

    run = make_demo_run(tmp / "run")
    export_bundle(run, tmp / "bundle")

or, both at once, ``make_demo_bundle(tmp, steps)`` (``tmp/run`` and ``tmp/bundle``).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import torch

from cis.core.spec import spec_to_dict
from cis.core.topologies import make_spec


def make_demo_run(
    run_dir: str | Path,
    steps: int = 200,
    seed: int = 0,
    serving: str = "60-30-10",
    topology: str = "paper-7",
    width: float = 1.0,
    batch_size: int = 64,
) -> Path:
    """Train a digits model briefly on all exits and save it as a run dir."""
    from cis.training.checkpoint import save_checkpoint
    from cis.training.data.loading import load_dataset
    from cis.training.models.cnns import default_model_config
    from cis.training.models.model_ref import build_model

    torch.manual_seed(seed)
    splits = load_dataset("digits", seed=seed)
    model = build_model(default_model_config("digits", width=width))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.from_numpy(splits.train.x)
    y = torch.from_numpy(splits.train.y)
    rng = np.random.default_rng(seed)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: one thread is fastest and leaves the other cores alone
    try:
        for _ in range(steps):
            idx = torch.from_numpy(rng.integers(0, len(y), size=batch_size))
            loss = cast(torch.Tensor, sum(torch.nn.functional.cross_entropy(out, y[idx]) for out in model(x[idx])))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    meta = {
        "classes": splits.train.classes,
        "normalisation": {"mean": splits.train.mean, "std": splits.train.std},
        "dataset": "digits",
        "seed": seed,
        "method": "cis",
        "spec": spec_to_dict(make_spec(topology, serving)),
        "trainer": "cis.exporter.fixture_bundle (central, all exits)",
        "steps": steps,
    }
    save_checkpoint(run_dir, model, meta)
    return Path(run_dir)


def make_demo_bundle(folder: str | Path, steps: int = 200, latency_repeats: int = 2) -> Path:
    """``make_demo_run(folder/run, steps)`` exported to ``folder/bundle`` (few latency repeats: fast); the bundle."""
    from cis.exporter.bundle_writer import export_bundle

    folder = Path(folder)
    export_bundle(make_demo_run(folder / "run", steps=steps), folder / "bundle", latency_repeats=latency_repeats)
    return folder / "bundle"
