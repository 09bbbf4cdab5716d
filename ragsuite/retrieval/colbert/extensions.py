"""Compile colbert-ai's C++ extensions ahead of their first use.

colbert-ai compiles its CPU extensions (``segmented_maxsim_cpp``, ``decompress_residuals_cpp``,
``filter_pids_cpp``, ``segmented_lookup_cpp``) with torch's JIT loader the first time an
index is built or searched: 1-3 minutes on 2 idle cores, far longer on a loaded machine, inside whatever
happens to run first (the first ``ragsuite index``, or a test fixture under pytest's per-test timeout). Run
this once beforehand, e.g. as a CI step before pytest::

    python -m ragsuite.retrieval.colbert.extensions

Later loads find the compiled modules in ``TORCH_EXTENSIONS_DIR`` and take well under a second. When that
variable is not set, ragsuite sets it to ``<virtual environment>/torch_extensions`` (one cache per
environment, so two environments with different torch builds never share a stale module): here, when an
index is opened (:mod:`ragsuite.retrieval.colbert.index`) and in the tests (``tests/conftest.py``), so all
three compile to and load from the same place. The extensions are built by colbert-ai's own loaders, with its
own sources and flags, so the cached modules are exactly the ones it will ask for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

#: colbert-ai's classes whose ``try_load_torch_extensions(use_gpu=False)`` compiles the CPU extensions.
_LOADERS = (
    ("colbert.modeling.colbert", "ColBERT"),
    ("colbert.search.strided_tensor", "StridedTensor"),
    ("colbert.search.index_storage", "IndexScorer"),
)


def default_extensions_dir() -> Path:
    """Where the compiled extensions go: ``$TORCH_EXTENSIONS_DIR``, else ``<sys.prefix>/torch_extensions``."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "torch_extensions"


def use_extensions_dir() -> Path:
    """Set ``TORCH_EXTENSIONS_DIR`` to :func:`default_extensions_dir` unless it is set (torch reads it at each
    compile or load); left to torch's own default when the environment's folder is not writable."""
    folder = default_extensions_dir()
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR", folder))


#: The extensions' module names (each compiled to ``<dir>/<name>/<name>.so``).
EXTENSIONS = (
    "decompress_residuals_cpp",
    "filter_pids_cpp",
    "segmented_lookup_cpp",
    "segmented_maxsim_cpp",
)


def build_extensions() -> list[Path]:
    """Compile (or load, when cached) every CPU extension colbert-ai uses.

    Returns:
        The compiled libraries, in :func:`use_extensions_dir`.

    Raises:
        MissingExtraError: without the ``colbert`` extra (the message names the pip command).
    """
    import importlib

    from ragsuite.errors import require

    folder = use_extensions_dir()
    require("colbert", extra="colbert", feature="colbert-ai's C++ extensions")
    for module_name, class_name in _LOADERS:
        cls = getattr(importlib.import_module(module_name), class_name)
        # use_gpu=False: the CPU ones. With a GPU colbert-ai compiles CUDA ones instead (and the residual
        # codec's), on first use.
        cls.try_load_torch_extensions(False)
    return sorted(path for name in EXTENSIONS for path in (folder / name).glob(f"{name}*.so"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ragsuite.retrieval.colbert.extensions",
        description="Compile colbert-ai's C++ extensions into TORCH_EXTENSIONS_DIR (default: "
        "<virtual environment>/torch_extensions) before their first use.",
    )
    parser.parse_args(argv)
    from ragsuite.errors import MissingExtraError

    started = time.monotonic()
    try:
        libraries = build_extensions()
    except MissingExtraError as exc:
        print(f"nothing to build: {exc}", file=sys.stderr)
        return 0
    took = time.monotonic() - started
    names = ", ".join(path.stem for path in libraries)
    print(f"colbert-ai extensions ready in {use_extensions_dir()} ({took:.0f} s): {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
