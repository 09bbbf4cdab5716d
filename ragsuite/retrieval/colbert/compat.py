"""Compatibility shims between colbert-ai 0.2.22 and newer transformers releases.

colbert-ai builds its model class (``HF_ColBERT``) in ``colbert.modeling.hf_colbert.class_factory`` and calls
``self.init_weights()`` in ``__init__``. From transformers 5 on, ``init_weights`` reads
``self.all_tied_weights_keys``, which only ``post_init()`` sets, so loading any checkpoint fails with
``'HF_ColBERT' object has no attribute 'all_tied_weights_keys'``. The ``colbert`` extra pins
``transformers<5``; this shim lets an environment that already has transformers 5 work too.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

log = logging.getLogger("ragsuite.retrieval.colbert.compat")

_PATCHED_ATTR = "_ragsuite_patched"
# colbert modules that import ``class_factory`` by name, so each one's reference must be replaced.
_FACTORY_USERS = (
    "colbert.modeling.hf_colbert",
    "colbert.modeling.base_colbert",
    "colbert.modeling.tokenization.query_tokenization",
    "colbert.modeling.tokenization.doc_tokenization",
)


def needs_tied_weights_shim(transformers_version: str) -> bool:
    """Whether ``transformers_version`` is a release whose ``init_weights`` needs ``post_init`` first."""
    try:
        return int(transformers_version.split(".")[0]) >= 5
    except ValueError:
        return False


def _init_weights_after_post_init(original: Any) -> Any:
    """Wrap ``init_weights`` so that it runs ``post_init()`` (which sets ``all_tied_weights_keys``) first."""

    @functools.wraps(original)
    def init_weights(self: Any) -> Any:
        if not hasattr(self, "all_tied_weights_keys") and not getattr(self, "_ragsuite_in_post_init", False):
            # post_init() itself initialises the weights (calling back into init_weights), so do only that.
            object.__setattr__(self, "_ragsuite_in_post_init", True)
            try:
                return self.post_init()
            finally:
                object.__setattr__(self, "_ragsuite_in_post_init", False)
        return original(self)

    return init_weights


def patch_model_class(cls: type) -> type:
    """Give a colbert-ai ``HF_ColBERT`` class the transformers-5 compatible ``init_weights``."""
    if not getattr(cls, _PATCHED_ATTR, False):
        cls.init_weights = _init_weights_after_post_init(cls.init_weights)  # type: ignore[attr-defined]
        setattr(cls, _PATCHED_ATTR, True)
    return cls


def patch_colbert_for_transformers(*, force: bool = False) -> bool:
    """Install the shim into the imported colbert modules when the installed transformers needs it.

    Args:
        force: Install it whatever the transformers version (for tests).

    Returns:
        Whether the shim is installed.
    """
    import transformers

    if not (force or needs_tied_weights_shim(transformers.__version__)):
        return False
    import colbert.modeling.hf_colbert as hf_colbert

    factory = hf_colbert.class_factory
    if not getattr(factory, _PATCHED_ATTR, False):
        original = factory

        @functools.wraps(original)
        def class_factory(name_or_path: str) -> type:
            return patch_model_class(original(name_or_path))

        setattr(class_factory, _PATCHED_ATTR, True)
        factory = class_factory
    for name in _FACTORY_USERS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "class_factory"):
            module.class_factory = factory
    log.debug("patched colbert-ai's HF_ColBERT for transformers %s", transformers.__version__)
    return True
