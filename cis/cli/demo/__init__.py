"""``cis demo``: the whole pipeline in one call (:mod:`~cis.cli.demo.pipeline`) and the comparison of its
three views (:mod:`~cis.cli.reports.compare`)."""
