"""The command layer: the ``cis`` command (:mod:`cis.cli.main`), one module per subcommand
(:mod:`cis.cli.commands`), ``cis demo``'s pipeline (:mod:`cis.cli.demo`) and ``cis report``'s reports
(:mod:`cis.cli.reports`).

It sits above everything else and is the only layer that imports training, the exporter and the
simulator (inside the commands that need them, so ``cis serve`` starts without torch); nothing below it
imports it. See docs/architecture.md, "Layers".
"""
