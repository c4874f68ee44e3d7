"""``cis train --engine flower``: Algorithm 1 on Flower (https://flower.ai), message API.

    strategy.py    CisStrategy: a flwr ``Strategy`` whose configure_train draws the round's
                   (node, exit) pairs and whose aggregate_train applies line 12, both with the
                   built-in engine's own objects (ExitSampler; FederatedEngine.aggregate_round)
    client_app.py  the ClientApp run by every SuperNode (one per CIS node): its partition,
                   the shared ExitSGDTrainer, momentum kept in ``context.state``
    server_app.py  the ServerApp: builds the server-side Setup, runs the strategy, writes the run dir
    records.py     ArrayRecord <-> state dict, the run config on the wire, node identity
    deploy.py      a SuperLink and SuperNodes on loopback (tests, benchmarks, ``mode="deployment"``)
    launch.py      run_flower(config, out, mode="simulation" | "deployment"): launches a run on an engine
    app/           the Flower app project (pyproject.toml) that ``flwr run`` submits

Nothing here imports flwr at package import; the modules below do (``pip install 'cis-inference[flower]'``).
See docs/flower.md.
"""
