"""A module ``torch.compile`` returned, handed to an entry point: the module itself, with a compiled ``forward``.

Lightning 2.6 (``lightning/pytorch/utilities/compile.py``, ``from_compiled``) trains the wrapped module and
compiles its ``forward`` and its four step methods; a step that calls ``self.log`` then fails to trace under
torch 2.13 (not 2.14). GPUlayer compiles ``forward`` only, with the options the user gave ``torch.compile``: the
steps, the hooks and ``self.log`` run eagerly around the compiled model, and checkpoints hold the module's own keys
(no ``_orig_mod.`` prefix). The module stays compiled after the run, as in Lightning.
"""

from __future__ import annotations

import sys
from typing import Any


def uncompiled(model: Any) -> Any:
    """``model`` when it is not what ``torch.compile`` returns, else the module it wraps, its ``forward``
    compiled (once, however many entry points it is handed to)."""
    dynamo = sys.modules.get("torch._dynamo")  # torch.compile imports it: without it, nothing was compiled
    if dynamo is None or not isinstance(model, dynamo.OptimizedModule):
        return model
    module = model._orig_mod
    if "forward" not in vars(module):  # not compiled by an earlier entry point
        module.forward = model.dynamo_ctx(module.forward)
    return module
