"""The exit policy: where a request is served (docs/architecture.md, "One policy, three users").

:class:`cis.core.policy.exit_policy.ExitPolicy` is the one piece of code that decides, used by the
offline evaluation, the runtime node and the simulator; :mod:`~cis.core.policy.decision` is its decision
on one micro-batch, :mod:`~cis.core.policy.confidence` the confidence measures,
:mod:`~cis.core.policy.patience` FLAME's patience rule and :mod:`~cis.core.policy.transfer_cap` the
transfer cap in time.
"""
