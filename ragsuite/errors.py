"""Exceptions raised by ragsuite. Each names what went wrong and what to do about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class RagsuiteError(Exception):
    """Base class of every error ragsuite raises on purpose."""


class ConfigError(RagsuiteError, ValueError):
    """A setting, flag or input file is invalid."""


class DataError(RagsuiteError, ValueError):
    """A dataset or corpus file is missing or malformed."""


class RetrievalError(RagsuiteError, RuntimeError):
    """A retriever failed (unreachable server, error reply, corrupt index). Never means "no passages"."""


class PortInUseError(RagsuiteError, OSError):
    """A server could not be started: another process already listens on its port."""


def installed_from_index(package: Path) -> bool:
    """Whether the ragsuite package folder ``package`` was installed from a package index: its metadata
    (``ragsuite-*.dist-info`` beside it in site-packages) has no ``direct_url.json``.

    Read directly rather than through ``importlib.metadata`` (about 50 ms that every ``--help`` would pay),
    which also looks at the copy actually imported rather than the first one on the path.
    """
    dist_infos = list(package.parent.glob("ragsuite-*.dist-info"))
    return bool(dist_infos) and not any((d / "direct_url.json").exists() for d in dist_infos)


def _package_dir() -> Path:
    """The folder of the ragsuite package imported here."""
    from pathlib import Path

    return Path(__file__).resolve().parent


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra`` for this copy of ragsuite.

    ``pip install 'ragsuite[EXTRA]'`` is only right when ragsuite itself came from a package index (its
    metadata has no ``direct_url.json``); an editable, local or URL install, or a clone run without
    installing, gets the extra from the clone.
    """
    if installed_from_index(_package_dir()):
        return f"pip install 'ragsuite[{extra}]'"
    return f"pip install -e '.[{extra}]' (from the ragsuite clone)"


class MissingExtraError(RagsuiteError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: {install_hint(extra)}"
        )
        self.package = package
        self.extra = extra


def require(module: str, *, extra: str, feature: str):
    """Import ``module`` or raise :class:`MissingExtraError` with the pip command that fixes it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module.split(".")[0], extra, feature) from exc


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived. A KeyboardInterrupt, so that every command stops on it as it does on Ctrl-C."""
