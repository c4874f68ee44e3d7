"""The testbed: every node of a spec in its own network namespace, behind links shaped as the spec says.

A launcher, a sibling of ``cis serve --all`` (:mod:`cis.runtime.launcher`): it
only places the same node processes in namespaces (:mod:`cis.runtime.testbed.plan`,
:mod:`cis.runtime.testbed.net`) and can partition a link or change its bandwidth
(:class:`cis.runtime.testbed.bed.Testbed`, ``cis link``, a ``--faults`` schedule). No
node knows it runs there. Linux only, as root, with iproute2 (``ip``, ``tc``).
See docs/testbed.md.
"""
