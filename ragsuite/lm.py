"""Language models for ragsuite programs: ``dspy.LM`` built from a short spec, per-stage LMs, and redaction
of secrets from anything that is written or logged.

LM specs:
    openai/MODEL                 OpenAI (key from ``$OPENAI_API_KEY``), e.g. ``openai/gpt-4o-mini``
    openai/NAME + api_base       any OpenAI-compatible server (vLLM, ``ragsuite serve``) serving NAME
    openai/NAME + URL1,URL2,...  the same model served by several replicas, spread over them by LiteLLM's
                                 Router (:mod:`ragsuite.lm_replicas`); also ``vllm:NAME@URL1,URL2``
    vllm:NAME[@URL]              shorthand for a vLLM server; URL defaults to http://127.0.0.1:8000/v1
    PROVIDER/MODEL               any other provider ``dspy.LM`` supports, with its usual environment key
    local[:NAME|PATH]            the embedded local LM (:mod:`ragsuite.local_lm`): a GGUF model from the
                                 package index (or any GGUF file), served on 127.0.0.1 for the command; no
                                 key, no network. With api_base: the server ``ragsuite serve --local`` started

Keys are read from the environment only. An OpenAI-compatible server given by ``api_base`` gets the key in
``api_key_env`` (default ``$VLLM_API_KEY``, the variable ``vllm serve`` itself reads) or, when that is unset,
a placeholder, since a local server started without ``--api-key`` accepts anything. The OpenAI key is never
sent to a custom ``api_base``. Replicas all get that same key: it goes only to the hosts given.

:func:`parse_lm_spec` only describes the endpoint (no server started, no host asked); :func:`resolve_endpoint`
is the one place that starts or finds the local server and registers the endpoint's credentials for
redaction, and :func:`build_lm` resolves the spec it is given.

Example:
    >>> lm = build_lm("vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu-host:8000/v1")
    >>> lm.model
    'openai/meta-llama/Llama-3.1-8B-Instruct'
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ragsuite.errors import ConfigError, RagsuiteError
from ragsuite.offline import use_bundled_model_metadata
from ragsuite.redaction import (
    PLACEHOLDER_KEY,
    SplitURL,
    redact,
    register_secret,
    split_url,
    split_url_credentials,
    strip_credentials,
)

if TYPE_CHECKING:
    import dspy

    from ragsuite.local_lm import LocalEndpoint

log = logging.getLogger("ragsuite.lm")

DEFAULT_VLLM_BASE = "http://127.0.0.1:8000/v1"
DEFAULT_VLLM_KEY_ENV = "VLLM_API_KEY"
SPEC_HELP = (
    "local[:NAME|PATH] (embedded model, no key) | openai/MODEL | openai/NAME with --api-base URL | "
    "vllm:NAME[@URL] | PROVIDER/MODEL"
)


class LMEndpointError(RagsuiteError, RuntimeError):
    """An LM endpoint cannot be used: unreachable, refusing the key, or not serving the model."""


@dataclass(frozen=True)
class LocalModelSpec:
    """What ``local[:NAME|PATH]`` asks for, before anything is resolved or started.

    Attributes:
        spec: The spec as given (``local``, ``local:NAME`` or ``local:PATH``).
        options: The server's settings (``engine``, ``parallel``, ``ctx``, ``threads``, ...), those given
            only, as sorted ``(name, value)`` pairs.
    """

    spec: str
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class LMSpec:
    """A parsed LM spec: the ``dspy.LM`` model string, the endpoint and where its key comes from.

    :func:`parse_lm_spec` makes one without side effects; :func:`resolve_endpoint` starts (or finds) the
    local server a ``local`` spec names and registers the endpoint's credentials for redaction.

    Attributes:
        model: The ``dspy.LM`` model string (``openai/NAME`` for OpenAI-compatible servers; the spec itself
            for a local model not resolved yet: its served name carries the file's hash).
        endpoints: The servers given by ``api_base``, their credentials split out (several: replicas of one
            model); empty for the provider's own endpoint.
        api_key_env: The environment variable holding the key, or None when a placeholder is used.
        local_model: For ``local[:...]``, the model and server settings asked for; else None.
        local: Once resolved, the running local server and its verified model file; else None.
    """

    model: str
    endpoints: tuple[SplitURL, ...] = ()
    api_key_env: str | None = None
    local_model: LocalModelSpec | None = None
    local: LocalEndpoint | None = None

    @property
    def api_base(self) -> str | None:
        """The (first) server's ``/v1`` URL without credentials, or None for the provider's own endpoint."""
        return self.endpoints[0].address if self.endpoints else None

    @property
    def authorization(self) -> str | None:
        """The basic ``Authorization`` header of the (first) server's ``user:password@``, if it had one."""
        return self.endpoints[0].authorization if self.endpoints else None

    @property
    def replicas(self) -> tuple[str, ...]:
        """With several servers for one model, all their URLs (``api_base`` is the first); else empty."""
        return self.servers if len(self.endpoints) > 1 else ()

    @property
    def servers(self) -> tuple[str, ...]:
        """Every server's URL: the replicas, or ``api_base`` alone (none for a provider's own endpoint)."""
        return tuple(endpoint.address for endpoint in self.endpoints)

    def public(self) -> dict[str, Any]:
        """The spec as saved in manifests: model and endpoint (credentials stripped; the list of replicas
        when there are several), never a key. A local model is recorded by its content hash and engine, not
        by the port its server happened to get."""
        if self.local is not None:
            return {**self.local.public(), "api_base": None, "key_env": None}
        if self.local_model is not None:
            return {"model": self.model, "api_base": None, "key_env": None}
        public = [endpoint.public for endpoint in self.endpoints]
        api_base: Any = public if len(public) > 1 else (public[0] if public else None)
        return {"model": self.model, "api_base": api_base, "key_env": self.api_key_env}


def split_api_bases(api_base: str | Sequence[str] | None) -> list[str]:
    """``"URL1,URL2"`` or ``["URL1", "URL2,URL3"]`` -> the URLs, without trailing ``/``.

    Raises:
        ConfigError: an empty item or a server given twice.
    """
    if api_base is None:
        return []
    items = [api_base] if isinstance(api_base, str) else list(api_base)
    urls = [part.strip().rstrip("/") for item in items for part in str(item).split(",")]
    if any(not url for url in urls):
        raise ConfigError(f"--api-base has an empty item: {redact(','.join(items))!r}")
    public = [strip_credentials(url) for url in urls]
    twice = sorted({url for url in public if public.count(url) > 1})
    if twice:
        raise ConfigError(f"--api-base names {', '.join(map(str, twice))} twice; give each replica once")
    return urls


def parse_lm_spec(
    spec: str,
    *,
    api_base: str | Sequence[str] | None = None,
    api_key_env: str | None = None,
    local_options: Mapping[str, Any] | None = None,
) -> LMSpec:
    """Describe the endpoint a spec (see the module docstring) and an optional ``api_base`` (one URL, a
    comma-separated list or a sequence of them: replicas of one model) name, as an :class:`LMSpec`.

    Pure: no server is started, no host is asked, nothing is registered for redaction; the same arguments
    give an equal spec. ``local[:NAME|PATH]`` records the model and ``local_options`` (``engine``,
    ``parallel``, ``ctx``, ``threads``) for :func:`resolve_endpoint`, which starts or finds its server.

    Raises:
        ConfigError: for a malformed spec.
    """
    bases = split_api_bases(api_base)
    spec = (spec or "").strip()
    if not spec:
        raise ConfigError(f"empty LM spec; expected {SPEC_HELP}")
    from ragsuite.local_lm import is_local_spec

    if is_local_spec(spec):
        if len(bases) > 1:
            raise ConfigError(
                "--lm local takes one --api-base (a `ragsuite serve --local` server), not replicas"
            )
        options = tuple(sorted((k, v) for k, v in (local_options or {}).items() if v is not None))
        endpoints = tuple(split_url(_check_url(url)) for url in bases)
        return LMSpec(spec, endpoints, None, local_model=LocalModelSpec(spec, options))
    if spec.startswith("vllm:"):
        rest = spec[len("vllm:") :]
        name, url = rest, None
        match = re.search(r"@([A-Za-z][\w+.-]*://\S+)$", rest)
        if match:
            name, url = rest[: match.start()], match.group(1)
        if not name:
            raise ConfigError(f"LM spec {redact(spec)!r} names no model; expected vllm:SERVED_NAME[@URL]")
        if url and bases and split_api_bases(url) != bases:
            raise ConfigError(
                f"LM spec {redact(spec)!r} and --api-base {redact(','.join(bases))} name different servers"
            )
        urls = split_api_bases(url) if url else bases or [DEFAULT_VLLM_BASE]
        return _server_spec(f"openai/{name}", urls, _key_env_for_server(api_key_env))
    provider, slash, name = spec.partition("/")
    if not slash or not provider or not name:
        raise ConfigError(f"LM spec {redact(spec)!r} is not PROVIDER/MODEL; expected {SPEC_HELP}")
    if bases:
        return _server_spec(spec, bases, _key_env_for_server(api_key_env))
    key_env = api_key_env or (f"{provider.upper()}_API_KEY" if provider == "openai" else None)
    return LMSpec(spec, (), key_env)


def _server_spec(model: str, urls: list[str], key_env: str | None) -> LMSpec:
    return LMSpec(model, tuple(split_url(_check_url(url)) for url in urls), key_env)


def _check_url(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"API base {redact(url)!r} is not an http(s) URL such as http://127.0.0.1:8000/v1")
    return url


def _key_env_for_server(api_key_env: str | None) -> str | None:
    if api_key_env:
        return api_key_env
    return DEFAULT_VLLM_KEY_ENV if os.environ.get(DEFAULT_VLLM_KEY_ENV) else None


def resolve_endpoint(spec: LMSpec) -> LMSpec:
    """Make ``spec``'s endpoint usable: the one place that starts (or reuses) the local LM server and that
    registers the endpoint's credentials for redaction.

    A ``local`` spec gets its running server (the one this process started for the same model and settings,
    else a new one stopped at exit, or the ``ragsuite serve --local`` server at its ``api_base``, which
    must serve this very file); any other spec comes back as it is. Resolving a resolved spec does nothing.

    Raises:
        ConfigError, ModelFileError, MissingExtraError, LocalServerError: as their messages say.
    """
    for endpoint in spec.endpoints:
        endpoint.register()
    if spec.local_model is None or spec.local is not None:
        return spec
    from ragsuite import local_lm

    asked = spec.local_model
    endpoint = local_lm.local_endpoint(asked.spec, api_base=spec.api_base, **dict(asked.options))
    served = (split_url(endpoint.api_base),)
    return replace(spec, model=f"openai/{endpoint.served_name}", endpoints=served, local=endpoint)


def resolve_key(spec: LMSpec) -> str | None:
    """The key for ``spec`` from the environment (placeholder for keyless servers).

    Raises:
        ConfigError: when the key's variable is required and unset.
    """
    if spec.local is not None and spec.local.api_key:
        return spec.local.api_key  # the local server's own key: no web page can use the server without it
    if spec.api_key_env is None:
        return PLACEHOLDER_KEY if spec.api_base else None
    value = os.environ.get(spec.api_key_env)
    if not value:
        where = f"the server at {strip_credentials(spec.api_base)}" if spec.api_base else spec.model
        raise ConfigError(
            f"{spec.api_key_env} is not set: {where} needs an API key. Export it in the environment "
            f"(export {spec.api_key_env}=...); keys are never read from flags or files."
        )
    register_secret(value)  # a variable of any name, e.g. --api-key-env MY_VAR
    return value


DEFAULT_TIMEOUT = 120.0
# A CPU generates a few tokens a second: a 1,024-token reply after a long prompt takes minutes, and a timed
# out attempt would be retried from the start.
LOCAL_TIMEOUT = 1800.0


def build_lm(
    spec: str | LMSpec,
    *,
    api_base: str | Sequence[str] | None = None,
    api_key_env: str | None = None,
    temperature: float = 0.1,
    max_tokens: int = 1024,
    timeout: float | None = None,
    retries: int = 4,
    cache: bool = True,
    seed: int | None = None,
    check: bool = False,
    max_retry_wait: float = 60.0,
    top_p: float | None = None,
    local_options: Mapping[str, Any] | None = None,
    max_connections: int | None = None,
) -> dspy.LM:
    """Build a ``dspy.LM`` from a spec.

    Transient failures (429 honouring ``Retry-After``, 5xx, timeouts, dropped connections) are retried by
    ``dspy.LM`` itself with exponential backoff (1 s, 2 s, 4 s, ...), ``retries`` times; no wait exceeds
    ``max_retry_wait`` seconds, whatever a server's ``Retry-After`` asks, and each wait is logged.

    Args:
        spec: See the module docstring; or an :class:`LMSpec` from :func:`parse_lm_spec` (resolved or not),
            which then carries the endpoint, so ``api_base``, ``api_key_env`` and ``local_options`` are not
            given.
        api_base: An OpenAI-compatible server's ``/v1`` URL (vLLM, ``ragsuite serve``); several (a
            comma-separated list or a sequence) are replicas of one model, spread over by LiteLLM's Router
            (:class:`ragsuite.lm_replicas.ReplicaLM`).
        api_key_env: Environment variable holding the key (default: ``OPENAI_API_KEY`` for OpenAI,
            ``VLLM_API_KEY`` if set for a server, else a placeholder).
        temperature: Sampling temperature (0.1, as in the papers).
        max_tokens: Completion budget per call.
        timeout: Seconds to wait for a reply before the attempt fails (and is retried); None: 120 s, or
            1,800 s for the local LM, whose replies on a CPU can take minutes (a retry would start over).
        retries: Retries after the first attempt.
        cache: Use DSPy's response cache (entries are kept per endpoint; a hit still reports its tokens).
        seed: Sampling seed sent with each request (OpenAI and vLLM honour it).
        check: Ask the server's ``/models`` now (see :func:`check_endpoint`).
        max_retry_wait: Longest wait before a retry, in seconds.
        top_p: Nucleus sampling; None leaves the provider's default.
        local_options: For ``local[:...]`` specs: ``engine``, ``parallel``, ``ctx``, ``threads`` of the
            server started for them (:class:`ragsuite.local_lm.LocalServer`).
        max_connections: The most requests the LM keeps in flight at once (its connection pool); None:
            DSPy's default, 100. The command line derives it from ``--threads``. Replicas go through
            LiteLLM's Router, whose own client this does not size.

    Raises:
        ConfigError: malformed spec or missing key.
        LMEndpointError: with ``check=True``, when the server is unreachable or does not serve the model.

    Example:
        >>> lm = build_lm("openai/gpt-4o-mini")  # needs OPENAI_API_KEY  # doctest: +SKIP
        >>> lm = build_lm("openai/llama", api_base="http://127.0.0.1:8000/v1")
        >>> lm.model
        'openai/llama'
        >>> lm = build_lm("openai/llama", api_base="http://gpu-1:8000/v1,http://gpu-2:8000/v1")
        >>> lm = build_lm("local")  # the embedded local model  # doctest: +SKIP
    """

    use_bundled_model_metadata()  # no download of a price map from a host the user did not name
    if retries < 0:
        raise ConfigError("retries must be >= 0")
    if timeout is not None and timeout <= 0:
        raise ConfigError("timeout must be > 0 seconds")
    if max_retry_wait < 0:
        raise ConfigError("max_retry_wait must be >= 0 seconds")
    if max_connections is not None and max_connections < 1:
        raise ConfigError("max_connections must be >= 1 (--max-connections)")
    if not isinstance(spec, LMSpec):
        spec = parse_lm_spec(spec, api_base=api_base, api_key_env=api_key_env, local_options=local_options)
    elif api_base is not None or api_key_env is not None or local_options is not None:
        raise ConfigError("build_lm takes api_base, api_key_env and local_options with a spec string only")
    parsed = resolve_endpoint(spec)
    key = resolve_key(parsed)
    if timeout is None:
        timeout = LOCAL_TIMEOUT if parsed.local is not None else DEFAULT_TIMEOUT
    kwargs: dict[str, Any] = {}
    if seed is not None:
        kwargs["seed"] = seed
    if top_p is not None:
        kwargs["top_p"] = top_p
    if check:
        check_endpoint(parsed, timeout=min(timeout, 10.0))
    _memoize_pricing_lookup()
    if parsed.replicas:
        from ragsuite.lm_replicas import ReplicaLM

        return ReplicaLM(
            parsed.model,
            replicas=parsed.endpoints,
            api_key=key,
            key_env=parsed.api_key_env,
            timeout=timeout,
            max_retry_wait=max_retry_wait,
            temperature=temperature,
            max_tokens=max_tokens,
            num_retries=retries,
            cache=cache,
            **kwargs,
        )
    if parsed.api_base:
        kwargs["api_base"] = parsed.api_base
        if parsed.authorization:
            # Credentials in the URL (a server behind HTTP basic auth) go in a header, never in the address.
            kwargs["extra_headers"] = {"Authorization": parsed.authorization}
    if key is not None:
        kwargs["api_key"] = key
    from ragsuite.lm_client import EndpointLM

    # Cached answers belong to the endpoint that gave them: one served name can mean two different models.
    # A local model's answers belong to its file's content and engine, whatever port its server got.
    scope = parsed.endpoints[0].public if parsed.endpoints else None
    return EndpointLM(
        parsed.model,
        cache_scope=parsed.local.cache_scope if parsed.local is not None else scope,
        structured_outputs=parsed.local is not None and parsed.local.structured_outputs,
        max_retry_wait=max_retry_wait,
        max_connections=max_connections,
        temperature=temperature,
        max_tokens=max_tokens,
        timeout=timeout,
        num_retries=retries,
        cache=cache,
        **kwargs,
    )


def _memoize_pricing_lookup() -> None:
    """Memoize dspy's per-reply pricing lookup (idempotent; a no-op if dspy's internals differ).

    dspy 3.4 prices every LM reply from its model metadata map. For a model the map does not list, which is
    every vLLM-served name, the lookup scans the whole map: ~0.3 ms, twice per call, holding the GIL, i.e.
    a fifth of a core at 16 threads against a fast server. The map is loaded once per process and never
    changes afterwards, so the answer for a (provider, model, namespaces) key never changes either.
    """
    try:
        from dspy.clients import costs
    except ImportError:
        return
    lookup = getattr(costs, "model_info", None)
    if lookup is None or getattr(lookup, "_ragsuite_memoized", False):
        return
    import copy

    memo: dict[tuple[Any, ...], Any] = {}

    def model_info(provider: Any, model: Any, *, namespaces: Any = None) -> Any:
        try:
            key = (provider, model, None if namespaces is None else tuple(namespaces))
            found = (
                memo[key]
                if key in memo
                else memo.setdefault(key, lookup(provider, model, namespaces=namespaces))
            )
        except TypeError:  # unhashable arguments: look up as dspy would
            return lookup(provider, model, namespaces=namespaces)
        return copy.deepcopy(found)  # callers may modify the entry they get, as with the original

    model_info._ragsuite_memoized = True  # type: ignore[attr-defined]
    costs.model_info = model_info


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only within the same scheme, host and port, carrying the key along; a redirect to
    another origin is refused, so the key is never sent to a host it was not given for."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if _origin(newurl) != _origin(req.full_url):
            raise LMEndpointError(
                f"the LM server at {strip_credentials(req.full_url)} redirected to another host "
                f"({strip_credentials(newurl)}); the key is not sent there. If you trust it, pass that "
                "address as --api-base."
            )
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and req.unredirected_hdrs.get("Authorization"):
            new.add_unredirected_header("Authorization", req.unredirected_hdrs["Authorization"])
        return new


def check_endpoint(spec: LMSpec, *, timeout: float = 10.0) -> list[str]:
    """Ask an OpenAI-compatible server which models it serves; fail clearly if it cannot be used.

    Only servers given by ``api_base`` are checked (the provider's own endpoint is left alone); with
    replicas, every one of them. An unresolved spec is resolved first (:func:`resolve_endpoint`).

    Returns:
        The served model ids (empty when nothing was checked).

    Raises:
        LMEndpointError: unreachable server, key refused, or the model not among those served.
    """
    spec = resolve_endpoint(spec)
    served: list[str] = []
    for endpoint in spec.endpoints:
        try:
            served += [name for name in _check_server(spec, endpoint, timeout=timeout) if name not in served]
        except LMEndpointError as exc:
            if spec.replicas:
                raise LMEndpointError(
                    f"{exc} (one of {len(spec.replicas)} replicas; leave it out of --api-base to run on the "
                    "others)"
                ) from None
            raise
    return served


def _check_server(spec: LMSpec, endpoint: SplitURL, *, timeout: float) -> list[str]:
    url = f"{endpoint.address}/models"
    shown = strip_credentials(url)
    key = resolve_key(spec)
    request = urllib.request.Request(url)
    authorization = endpoint.authorization or (f"Bearer {key}" if key else None)
    if authorization:
        # Unredirected: urllib would otherwise copy the key onto a redirect to any host.
        request.add_unredirected_header("Authorization", authorization)
    try:
        with urllib.request.build_opener(_SameOriginRedirects).open(request, timeout=timeout) as reply:
            import json

            payload = json.loads(reply.read() or b"{}")
    except LMEndpointError:
        raise
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise LMEndpointError(
                f"the LM server at {shown} refused the API key (HTTP {exc.code}); set the variable it "
                f"expects ({spec.api_key_env or DEFAULT_VLLM_KEY_ENV}) or pass --api-key-env NAME"
            ) from None
        raise LMEndpointError(f"the LM server at {shown} answered HTTP {exc.code} to GET /models") from None
    except (urllib.error.URLError, OSError, ValueError, RecursionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LMEndpointError(
            f"cannot reach the LM server at {shown} ({redact(str(reason))}). Is it running? Start one with "
            "`ragsuite serve --model NAME` or check --api-base."
        ) from None
    from ragsuite.processes import model_entries

    try:
        served = [entry["id"] for entry in model_entries(payload)]
    except ValueError as exc:
        raise LMEndpointError(
            f"the LM server at {shown} answered GET /models with JSON that is not an OpenAI model list "
            f"({exc}); check --api-base: it is the address of an OpenAI-compatible server, ending in /v1"
        ) from None
    name = spec.model.partition("/")[2]
    if served and name not in served:
        raise LMEndpointError(
            f"the LM server at {shown} does not serve model {name!r}; it serves: {', '.join(served)}. "
            f"Use --lm openai/{served[0]} (or vllm:{served[0]})."
        )
    return served


def explain_lm_error(exc: BaseException, *, model: str | None = None) -> str | None:
    """A clear, redacted message for errors that make every further call pointless (bad key, unknown
    model, unreachable server), or None for errors worth recording per example and moving on."""
    from dspy.utils.exceptions import (
        LMAuthError,
        LMBillingError,
        LMConfigurationError,
        LMTransportError,
        LMUnsupportedModelError,
    )

    text = redact(str(exc))
    if isinstance(exc, LMAuthError):
        return f"the LM provider refused the API key: {text}"
    if isinstance(exc, LMBillingError):
        return f"the LM provider refused the request for billing reasons: {text}"
    if isinstance(exc, LMUnsupportedModelError) or getattr(exc, "status_code", None) == 404:
        return f"unknown model{f' {model!r}' if model else ''}: {text}"
    if isinstance(exc, LMConfigurationError):
        return f"the LM is misconfigured: {text}"
    if isinstance(exc, LMTransportError) and "failed to connect" in str(exc):
        if "openai.com" in str(exc):  # the provider's own endpoint: a network problem, not a local server
            return f"cannot reach the LM provider: {text}. Check the network, a proxy or a firewall."
        return f"cannot reach the LM endpoint: {text}. Is the server running (`ragsuite serve`)?"
    return None


def describe_lm_failure(exc: BaseException, *, lm: Any = None) -> str | None:
    """A message for a per-example LM failure that names the flag to change (``--timeout``, ``--retries``,
    ``--max-retry-wait``, ``--threads``), instead of the client library's internal advice; None when the
    error's own text is the best there is."""
    from dspy.utils.exceptions import LMRateLimitError, LMTimeoutError, LMTransportError

    retries = getattr(lm, "num_retries", None)
    attempts = "every attempt"
    if isinstance(retries, int):
        attempts = f"{retries + 1} attempt(s), retried with backoff"
    # A read timeout reaches us as a transport error whose advice names the client library's own setting;
    # self-rag's completions raise the openai client's errors (APITimeoutError, status 429) instead.
    timed_out = isinstance(exc, LMTransportError) and "timed out" in str(exc)
    timed_out = timed_out or type(exc).__name__ == "APITimeoutError"
    if isinstance(exc, LMTimeoutError) or timed_out:
        timeout = (getattr(lm, "kwargs", None) or {}).get("timeout", getattr(lm, "timeout", None))
        limit = f" {timeout:g} s" if isinstance(timeout, (int, float)) else ""
        return (
            f"the LM did not answer within --timeout{limit} on {attempts}; raise --timeout or "
            "--retries, or check the server's load"
        )
    if isinstance(exc, LMRateLimitError) or getattr(exc, "status_code", None) == 429:
        return (
            f"the LM answered 429 (rate limited) on {attempts}; lower --threads, or raise --retries "
            "or --max-retry-wait"
        )
    text = str(exc)
    if "exceeds the available context size" in text or "context length" in text.lower():
        # The server refused a prompt longer than its window: nothing was sent to fail halfway.
        return (
            f"the prompt does not fit the LM's context window ({redact(text.splitlines()[0])[:300]}); "
            "raise --local-ctx (the local LM) or the server's own limit, or lower top_k / --max-tokens"
        )
    return None


def set_stage_lms(program: dspy.Module, stage_lms: Mapping[str, dspy.BaseLM]) -> dict[str, list[str]]:
    """Give the predictors of some stages their own LM (e.g. a small model for ``route``/``filter``).

    A predictor belongs to the stage named by the first dotted component of its name in
    ``program.named_predictors()`` (``answer.predict`` -> ``answer``).

    Returns:
        Stage -> names of the predictors whose LM was set.

    Raises:
        ConfigError: a stage the program does not have (the message lists the ones it has).

    Example:
        >>> from ragsuite import programs
        >>> program = programs.get("hanrag")()
        >>> small = build_lm("openai/small", api_base="http://127.0.0.1:8000/v1")
        >>> set_stage_lms(program, {"route": small})  # the stages set, with the predictors they reached
        {'route': ['route']}
        >>> program.route.lm is small
        True
    """
    by_stage: dict[str, list[tuple[str, Any]]] = {}
    for name, predictor in program.named_predictors():
        by_stage.setdefault(name.split(".", 1)[0], []).append((name, predictor))
    unknown = sorted(set(stage_lms) - set(by_stage))
    if unknown:
        raise ConfigError(
            f"{type(program).__name__} has no stage {', '.join(map(repr, unknown))}; "
            f"its stages are: {', '.join(sorted(by_stage)) or '(none)'}"
        )
    done: dict[str, list[str]] = {}
    for stage, lm in stage_lms.items():
        for name, predictor in by_stage[stage]:
            predictor.lm = lm
            done.setdefault(stage, []).append(name)
    return done


def parse_stage_lms(items: list[str] | None) -> dict[str, str]:
    """``["route=SPEC", ...]`` -> ``{"route": "SPEC"}``; a repeated stage or missing ``=`` is an error."""
    result: dict[str, str] = {}
    for item in items or []:
        stage, eq, spec = item.partition("=")
        stage, spec = stage.strip(), spec.strip()
        if not eq or not stage or not spec:
            raise ConfigError(f"--stage-lm expects STAGE=SPEC (e.g. route=vllm:small), not {item!r}")
        if stage in result:
            raise ConfigError(f"--stage-lm gives stage {stage!r} twice")
        result[stage] = spec
    return result


__all__ = [
    "SPEC_HELP",
    "LMEndpointError",
    "LMSpec",
    "LocalModelSpec",
    "build_lm",
    "check_endpoint",
    "describe_lm_failure",
    "explain_lm_error",
    "parse_lm_spec",
    "parse_stage_lms",
    "redact",
    "resolve_endpoint",
    "set_stage_lms",
    "split_api_bases",
    "split_url_credentials",
    "strip_credentials",
]
