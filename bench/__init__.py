"""The benchmarks: a package run from the repository root as ``python -m bench.NAME`` (``--help`` on each).

One harness (:mod:`bench.harness`) starts a cluster (``cis serve --all``, :mod:`cis.runtime.launcher`), drives a load
(:mod:`cis.runtime.loadgen`, the load generator ``cis bench`` is) and writes results (``bench/results/NAME.json``
and ``.md``); bench/README.md lists the benchmarks and which of their files git keeps.
"""
