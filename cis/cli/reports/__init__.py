"""``cis report``: a folder in, a report out (:mod:`~cis.cli.reports.builder`), read section by section
(:mod:`~cis.cli.reports.readers`), rendered as text and markdown (:mod:`~cis.cli.reports.render`) with plots
(:mod:`~cis.cli.reports.plots`)."""
