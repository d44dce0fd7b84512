"""transformers' Qwen3.5 modeling module, as this package imports it: with its own torch functions.

When the module is first imported, transformers binds each Gated DeltaNet rule to flash-linear-attention's
(``fla``) wherever ``import fla`` works (``transformers:integrations/hub_kernels.py``,
``use_kernel_func_from_hub_with_fallback``). Where fla is installed without a GPU (the ``fla`` extra on a
machine that builds engines for one), its Triton kernels have no backend: transformers' own forward would
fail, and the import warns and leaves Triton objects that report themselves at exit. This package binds the
layer functions itself wherever it runs the model (``s1omni.runtime.runners.torch_runner.bound``, fla only for
``s1omni bench``'s ``reference+fla``), so ``modeling`` imports the module with fla hidden, once: its functions
are then the torch ones on every machine, and fla stays importable for those who bind it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
HIDDEN = "fla"


def modeling() -> ModuleType:
    """``transformers.models.qwen3_5.modeling_qwen3_5``, first imported with ``fla`` hidden."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    imported = {name: sys.modules.pop(name) for name in list(sys.modules) if name == HIDDEN or name.startswith(HIDDEN + ".")}
    sys.modules[HIDDEN] = None  # type: ignore[assignment]  # `import fla` raises ImportError while this holds
    try:
        return importlib.import_module(MODULE)
    finally:
        del sys.modules[HIDDEN]
        sys.modules.update(imported)
