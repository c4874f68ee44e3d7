"""The SimPy simulator of a CIS (``cis simulate``). Imports no torch.

``simulate(spec, SimConfig(...), bundle)`` runs one load; :mod:`cis.sim.sweep` runs
many in parallel. See docs/simulator.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimConfig", "SimResult", "simulate"]


def __getattr__(name: str) -> Any:
    """The package's names, imported when first asked for: ``import cis.sim.config`` (cis simulate's flags) stays
    light, without SimPy."""
    if name == "SimConfig":
        from cis.sim.config import SimConfig

        return SimConfig
    if name in ("SimResult", "simulate"):
        from cis.sim import simulation

        return getattr(simulation, name)
    raise AttributeError(name)
