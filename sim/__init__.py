"""The SimPy simulator of a CIS (``cis simulate``). Imports no torch.

``simulate(spec, SimConfig(...), bundle)`` runs one load; :mod:`sim.sweep` runs
many in parallel. See docs/simulator.md.
"""

from sim.config import SimConfig
from sim.run import SimResult, simulate

__all__ = ["SimConfig", "SimResult", "simulate"]
