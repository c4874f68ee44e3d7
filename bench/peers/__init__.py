"""cis beside its peers (issue 34): ``python -m bench.peers`` (:mod:`bench.peers.run`); the servers it starts
(:mod:`bench.peers.ray_serve_cis`, :mod:`bench.peers.kserve_cis`, :mod:`bench.peers.mlserver_cis`,
:mod:`bench.peers.null_oip`) run as ``python -m bench.peers.NAME`` from the repository root."""
