"""The command layer's own modules: ``cis demo``'s pipeline and ``cis report``'s reports.

They sit above everything else: they may import training, export and sim (inside the
functions that need them, so importing this package pulls no torch); nothing below
the command layer (the cis core, training, export, sim) imports them. See
docs/architecture.md, "Layers".

- :mod:`cis.app.pipeline`: the whole pipeline in one call (``cis demo``), with
  :mod:`cis.app.calibration` (what a node visit costs on the live cluster, for the simulator);
- :mod:`cis.app.report`: a folder in, the report out (``cis report``, ``cis demo``), built from
  :mod:`cis.app.compare` (the comparison maths), :mod:`cis.app.readers` (one section per folder
  kind), :mod:`cis.app.render` (text and markdown) and :mod:`cis.app.plots`.
"""
