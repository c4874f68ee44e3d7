"""Importing torchvision (and timm, which imports it) beside a CPU-only torch: the one fallback, in one place.

PyPI's torchvision wheels that match torch 2.13 are CUDA builds. Beside the CPU build of torch,
``import torchvision`` fails while it registers the fake (meta) kernels of its C++ operators:
``RuntimeError: operator torchvision::nms does not exist`` (its ``_C`` library needs CUDA's). The
classification models are pure Python and need none of those operators, so where the normal import fails
with exactly that error, :func:`import_torchvision` drops the half-imported modules, puts an empty module
in place of ``torchvision._meta_registrations`` and imports again, logging one warning per process. Where
the normal import works (a matching CPU or CUDA build), nothing is touched. Detection ops (nms, roi_align)
stay unavailable in the fallback; models, transforms and ``feature_extraction`` work.

The model loader (cis/training/models/model_ref.py) calls :func:`import_torchvision` when a user's model file fails to
import with that error, then imports the file again, so ``import torchvision`` in a model file just works.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from types import ModuleType

logger = logging.getLogger(__name__)

_META = "torchvision._meta_registrations"
_warned = False


def is_cuda_build_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the CUDA torchvision's failure beside a CPU torch (``operator torchvision::... does
    not exist``)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and "operator torchvision::" in text and "does not exist" in text


def _drop(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def import_torchvision() -> ModuleType:
    """``torchvision``, through the fallback of the module docstring only where the normal import fails with
    the CUDA build's error; ModuleNotFoundError where it is not installed (the 'vision' extra)."""
    global _warned
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if not is_cuda_build_error(exc):
            raise
        _drop("torchvision")
        _drop("timm")  # timm imports torchvision; a half-imported timm would keep the broken one
        sys.modules[_META] = types.ModuleType(_META)
        module = importlib.import_module("torchvision")
        if not _warned:
            _warned = True
            logger.warning(
                "torchvision %s is a CUDA build beside a CPU torch; imported without its C++ operators "
                "(models work; detection ops such as nms do not): docs/your-model.md, 'torchvision beside a CPU torch'",
                getattr(module, "__version__", "?"),
            )
        return module


def import_timm() -> ModuleType:
    """``timm`` (torchvision first, through :func:`import_torchvision`)."""
    import_torchvision()
    return importlib.import_module("timm")
