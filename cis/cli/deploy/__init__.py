"""The deployment kit: what ``cis deploy`` writes from a spec (and a bundle) for a cluster to run.

- :mod:`cis.cli.deploy.plan`: what every target shares: each node's name, port, the address it binds and
  its parent's, and the ``cis serve`` options it runs with (``CIS_*`` variables: serve's own table);
- :mod:`cis.cli.deploy.resources`: CPU and memory per node from the bundle's latency profile and the rate
  calculus (the rule is in docs/deploy.md);
- :mod:`cis.cli.deploy.kubernetes`: a Deployment and a Service per node, the spec as a ConfigMap;
- :mod:`cis.cli.deploy.systemd`: the ``cis-node@.service`` template unit and one environment file per node;
- :mod:`cis.cli.deploy.files`: writing them (YAML without a YAML library; the output folder's record).

It lives in the command layer because what it writes is ``cis serve``'s own interface (its flags and
``CIS_*`` variables, :mod:`cis.cli.commands.serve_config`); it needs no torch (docs/architecture.md).
"""
