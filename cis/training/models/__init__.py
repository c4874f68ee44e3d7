"""Models with exits: the public contract (:mod:`~cis.training.models.contract`: an ordered list of
``(body, head)`` stages), references to a user's factory (:mod:`~cis.training.models.model_ref`), the
built-in CNNs (:mod:`~cis.training.models.cnns`; every built-in factory is in :mod:`cis.training.architectures`),
exits on a torchvision or timm backbone (:mod:`~cis.training.models.backbone`,
:mod:`~cis.training.models.vision`), where a model is cut (:mod:`~cis.training.models.stage_plan`) and
what each exit costs (:mod:`~cis.training.models.flops`)."""
