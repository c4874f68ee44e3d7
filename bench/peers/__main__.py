"""``python -m bench.peers``: :func:`bench.peers.run.main`."""

from bench.peers.run import main

raise SystemExit(main())
