"""What a run directory's ``manifest.json`` says: the keys that define a run (resuming with any of them
changed is refused), the default manifest of a program, and the versions and git revision behind the results.

Example:
    >>> from ragsuite.evaluation.manifest import config_diff
    >>> config_diff({"dataset": "hotpotqa", "seed": 0}, {"dataset": "hotpotqa", "seed": 1})
    ['seed: 0 -> 1']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Manifest keys that define a run: resuming with any of them changed is refused.
CONFIG_KEYS = (
    "program",
    "program_file_sha256",
    "knobs",
    "artifacts",
    "lm",
    "stage_lms",
    "dataset",
    "split",
    "seed",
    "limit",
    "retriever",
    "examples_sha256",
)
_NOT_CONFIG = ("api_base", "key_env")


def config_diff(
    saved: Mapping[str, Any], now: Mapping[str, Any], keys: Sequence[str] = CONFIG_KEYS
) -> list[str]:
    """Human-readable differences between two manifests on the configuration keys.

    Where an LM is served (``api_base``) and which variable holds its key are not configuration: the same
    model may be served from another address when a run is resumed."""
    diffs: list[str] = []

    def walk(prefix: str, a: Any, b: Any) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key in _NOT_CONFIG and prefix.split(".")[0] in ("lm", "stage_lms", "judge_lm"):
                    continue
                walk(f"{prefix}.{key}", a.get(key), b.get(key))
        elif a != b:
            diffs.append(f"{prefix}: {json.dumps(a)} -> {json.dumps(b)}")

    for key in keys:
        walk(key, saved.get(key), now.get(key))
    return diffs


def examples_fingerprint(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def program_artifacts(program: Any) -> dict[str, Any]:
    """``{"artifacts": ...}``: the content hashes of the files the program's knobs point to (a trained
    classifier), or nothing when it has none, so that runs without such files keep their manifests."""
    method = getattr(program, "artifacts", None)
    artifacts = method() if callable(method) else {}
    return {"artifacts": artifacts} if artifacts else {}


def default_manifest(program: Any, dataset: str, ids: Sequence[str]) -> dict[str, Any]:
    knobs = program.knobs() if hasattr(program, "knobs") else {}
    return {
        "program": getattr(program, "name", type(program).__name__),
        "knobs": knobs,
        **program_artifacts(program),
        "dataset": dataset,
        "examples_sha256": examples_fingerprint(ids),
        "n_examples": len(ids),
        "versions": package_versions(),
    }


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages that change results."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in ("ragsuite", "dspy", "litellm", "openai", "optuna", "bm25s"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_revision() -> dict[str, Any] | None:
    """The ragsuite checkout's commit and whether it has uncommitted changes, when it is a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": rev, "dirty": bool(dirty)}
