"""``dspy.LM`` made safe for benchmarking: cached answers belong to the endpoint that gave them, a cache hit
still reports the tokens its answer cost, and no retry waits longer than a cap.

DSPy keys a cached response by the request (model name, messages, sampling settings) but deliberately not by
the endpoint (``api_base``), so two servers serving different models under one name (a vLLM replica swapped
for another checkpoint, a local and a remote ``llama``) would share answers: a run against the second server
silently scores the first one's replies. :class:`EndpointLM` scopes its cache entries by its endpoint
(without credentials). DSPy also reports no usage for a cache hit, so a cost objective would see a cached
call as free; :class:`EndpointLM` hands the cached response's usage to the active usage tracker as
*cached* usage (see ``ragsuite.evaluation``), counted apart from the requests that reached the provider.

DSPy retries 429/5xx/timeouts itself and honours a server's ``Retry-After``, however long: ``Retry-After:
3600`` (or a date in 2099) would stall a run silently for an hour. :class:`EndpointLM` caps every wait at
``max_retry_wait`` seconds and logs each one (what failed, how long, which attempt); :func:`retry_wait` is
that cap and log, for clients that retry on their own (Self-RAG's ``/v1/completions`` calls).

A reply is bounded: one longer than :func:`max_reply_chars` (``max_tokens`` cannot produce it; the server
ignored the limit) is refused with :class:`LMReplyTooLongError`, which the run records as that example's
error. DSPy would otherwise parse it, and on a failed parse retry the call with its JSON adapter, whose
repair of malformed JSON (``json_repair``) takes super-linear time: a 1 MB reply held a run for minutes.

DSPy's client keeps at most 100 connections per LM (lm15's default pool, which ``dspy.LM`` does not expose):
past 100 requests in flight, calls queue for a connection however many threads or tasks make them.
:class:`EndpointLM` takes ``max_connections`` and gives it to the pool DSPy builds for that LM only.

The hooks are small patches of dspy 3.4's internals (``Cache.cache_key``, ``LM.update_history``, the
retry delay and the ``RouterConfig`` of ``dspy.clients.execution``); the tests fail if a DSPy release changes
them.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import email.utils
import hashlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import dspy
from dspy.clients import execution
from dspy.clients.cache import Cache

from ragsuite.errors import RagsuiteError

log = logging.getLogger("ragsuite.lm")

#: The longest a retry waits by default, whatever the server's Retry-After says.
DEFAULT_MAX_RETRY_WAIT = 60.0

#: Characters per token a reply may average before it counts as longer than ``max_tokens`` allows (real
#: tokens average about 4; a run of spaces or punctuation can make one token longer).
MAX_CHARS_PER_TOKEN = 16
#: The bound for any ``max_tokens``: DSPy's JSON repair of a malformed reply this long takes about 2 s.
MIN_REPLY_BOUND = 65_536


class LMReplyTooLongError(RagsuiteError, RuntimeError):
    """The LM's reply is longer than its ``max_tokens`` allows; it is recorded as the example's error."""


def max_reply_chars(max_tokens: Any) -> int:
    """The longest reply accepted from an LM asked for at most ``max_tokens`` tokens, in characters."""
    tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 0
    return max(MIN_REPLY_BOUND, MAX_CHARS_PER_TOKEN * tokens)


# The endpoint of the LM call running in this context, or None (DSPy's own key).
_CACHE_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ragsuite_cache_scope", default=None
)


def _install_scoped_cache_keys() -> None:
    """Make ``Cache.cache_key`` include the calling LM's endpoint (idempotent)."""
    original = Cache.cache_key
    if getattr(original, "_ragsuite_scoped", False):
        return

    def cache_key(self: Cache, request: dict[str, Any], ignored_args_for_cache_key: Any = None) -> str:
        key = original(self, request, ignored_args_for_cache_key)
        scope = _CACHE_SCOPE.get()
        return key if scope is None else hashlib.sha256(f"{scope}\n{key}".encode()).hexdigest()

    cache_key._ragsuite_scoped = True  # type: ignore[attr-defined]
    Cache.cache_key = cache_key  # type: ignore[method-assign]


# The retry-wait cap of the LM call running in this context (None: DSPy's own waits).
_MAX_WAIT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ragsuite_max_retry_wait", default=None
)


def retry_after_seconds(value: Any) -> float | None:
    """The seconds a ``Retry-After`` value asks for (a number of seconds or an HTTP date), or None when it is
    neither (absent, negative, unparsable)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        seconds = None
    if seconds is not None:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    if not isinstance(value, str):
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def retry_wait(
    exc: BaseException,
    attempt: int,
    *,
    cap: float,
    retry_after: Any = None,
    wanted: float | None = None,
) -> float:
    """The wait before retrying an LM call that failed with ``exc``, capped at ``cap`` seconds and logged
    (logger ``ragsuite.lm``): every capped retry of ragsuite's LM calls goes through here.

    Args:
        exc: The error of the failed attempt.
        attempt: The failed attempt, from 0.
        cap: The longest wait (``--max-retry-wait``).
        retry_after: The server's ``Retry-After`` (seconds or an HTTP date), if it sent one.
        wanted: The wait the client would take; default: ``retry_after`` when given, else exponential
            backoff ``min(2 ** attempt, 60)`` seconds, as DSPy's own retries.

    Example:
        >>> retry_wait(TimeoutError(), 0, cap=60.0)  # logs "LM call failed (TimeoutError); retry 1 in 1.0 s"
        1.0
    """
    if wanted is None:
        asked = retry_after_seconds(retry_after)
        wanted = asked if asked is not None else float(min(2 ** min(attempt, 6), 60))
    wait = min(float(wanted), cap)
    capped = ""
    if wait < wanted:
        capped = (
            " (capped by --max-retry-wait)"
            if retry_after is None
            else f" (the server asked for {retry_after}; capped by --max-retry-wait)"
        )
    log.warning("LM call failed (%s); retry %d in %.1f s%s", type(exc).__name__, attempt + 1, wait, capped)
    return wait


def _install_capped_retry_waits() -> None:
    """Cap and log DSPy's wait before each retry (idempotent)."""
    original = execution._delay
    if getattr(original, "_ragsuite_capped", False):
        return

    def delay(exc: BaseException, attempt: int) -> float:
        wanted = original(exc, attempt)
        cap = _MAX_WAIT.get()
        if cap is None:
            return wanted
        return retry_wait(exc, attempt, cap=cap, retry_after=getattr(exc, "retry_after", None), wanted=wanted)

    delay._ragsuite_capped = True  # type: ignore[attr-defined]
    execution._delay = delay


# The connection pool of the LM call running in this context (None: DSPy's default, 100).
_MAX_CONNECTIONS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "ragsuite_max_connections", default=None
)


def _install_connection_limits() -> None:
    """Size the connection pool DSPy builds for an LM by that LM's ``max_connections`` (idempotent).

    dspy 3.4 builds one lm15 ``RouterConfig`` per LM (and per event loop) in ``dspy.clients.execution`` on
    the LM's first call, without ``max_connections``; the pool built from it is that LM's alone, so the
    value in force during the call that builds it belongs to that LM.
    """
    original = execution.RouterConfig
    if getattr(original, "_ragsuite_connections", False):
        return

    def router_config(*args: Any, **kwargs: Any) -> Any:
        limit = _MAX_CONNECTIONS.get()
        # lm15 refuses max_connections beside a transport of the caller's own; DSPy passes none today.
        if limit is not None and kwargs.get("max_connections") is None and kwargs.get("transport") is None:
            kwargs["max_connections"] = limit
        return original(*args, **kwargs)

    router_config._ragsuite_connections = True  # type: ignore[attr-defined]
    execution.RouterConfig = router_config  # type: ignore[misc]


@contextlib.contextmanager
def _scoped(scope: str | None, max_wait: float | None, max_connections: int | None = None) -> Iterator[None]:
    tokens = _CACHE_SCOPE.set(scope), _MAX_WAIT.set(max_wait), _MAX_CONNECTIONS.set(max_connections)
    try:
        yield
    finally:
        _CACHE_SCOPE.reset(tokens[0])
        _MAX_WAIT.reset(tokens[1])
        _MAX_CONNECTIONS.reset(tokens[2])


def response_usage(response: Any) -> dict[str, int] | None:
    """``{"prompt_tokens", "completion_tokens"}`` of a (cached) provider response, or None when it has none.

    Handles LiteLLM/OpenAI responses (``usage.prompt_tokens``) and DSPy's native responses
    (``usage.input_tokens``), alone or in a list (one per completion)."""
    responses = response if isinstance(response, (list, tuple)) else [response]
    prompt = completion = 0
    found = False
    for item in responses:
        usage = item.get("usage") if isinstance(item, dict) else getattr(item, "usage", None)
        if usage is None:
            continue

        def read(*names: str, usage: Any = usage) -> int:
            for name in names:
                value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
                if value is not None:
                    return int(value)
            return 0

        prompt += read("prompt_tokens", "input_tokens")
        completion += read("completion_tokens", "output_tokens")
        found = True
    return {"prompt_tokens": prompt, "completion_tokens": completion} if found else None


class EndpointLM(dspy.LM):
    """``dspy.LM`` whose cache entries belong to its endpoint and whose cache hits report their tokens.

    Args:
        model: As for ``dspy.LM``.
        cache_scope: The endpoint (``api_base`` without credentials); None for the provider's default one.
        max_retry_wait: Longest wait before a retry, in seconds, whatever ``Retry-After`` says.
        structured_outputs: The server constrains a reply to a JSON schema given as ``response_format``
            (llama-server does, with a grammar): DSPy's JSON adapter then sends each signature's schema, and
            a reply always parses. DSPy cannot know this of a served name it has never heard of.
        max_connections: The most requests this LM keeps in flight at once (its connection pool); None:
            DSPy's default, 100.
        **kwargs: As for ``dspy.LM``.

    Example:
        >>> lm = EndpointLM("openai/llama", cache_scope="http://gpu-1:8000/v1", api_base="http://gpu-1:8000/v1")
    """

    def __init__(
        self,
        model: str,
        *,
        cache_scope: str | None = None,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        structured_outputs: bool = False,
        max_connections: int | None = None,
        **kwargs: Any,
    ) -> None:
        if max_connections is not None and (isinstance(max_connections, bool) or max_connections < 1):
            raise ValueError(f"max_connections must be a whole number >= 1, not {max_connections!r}")
        _install_scoped_cache_keys()
        _install_capped_retry_waits()
        _install_connection_limits()
        super().__init__(model, **kwargs)
        self.cache_scope = cache_scope
        self.max_retry_wait = float(max_retry_wait)
        self.structured_outputs = structured_outputs
        self.max_connections = max_connections

    @property
    def supports_response_schema(self) -> bool:
        return self.structured_outputs or super().supports_response_schema

    @property
    def supported_params(self) -> set[str]:
        params = super().supported_params
        return params | {"response_format"} if self.structured_outputs else params

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        with _scoped(self.cache_scope, self.max_retry_wait, getattr(self, "max_connections", None)):
            return self._bounded(super().__call__(prompt, messages=messages, **kwargs), kwargs)

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        with _scoped(self.cache_scope, self.max_retry_wait, getattr(self, "max_connections", None)):
            return self._bounded(await super().acall(prompt, messages=messages, **kwargs), kwargs)

    def _bounded(self, outputs: Any, kwargs: dict[str, Any]) -> Any:
        """``outputs``, or :class:`LMReplyTooLongError` before any adapter parses a reply that
        ``max_tokens`` cannot have produced."""
        settings = {**self.kwargs, **kwargs}
        max_tokens = settings.get("max_tokens") or settings.get("max_completion_tokens")
        bound = max_reply_chars(max_tokens)
        for output in outputs if isinstance(outputs, list) else []:
            text = output.get("text") if isinstance(output, dict) else output
            if isinstance(text, str) and len(text) > bound:
                limit = f"max_tokens={max_tokens} can produce" if max_tokens else "a reply may hold"
                raise LMReplyTooLongError(
                    f"the LM replied with {len(text):,} characters, more than {limit} (at most {bound:,} are "
                    "accepted); the server ignored the limit: check its settings (a proxy that drops "
                    "max_tokens, a model that never stops) or raise --max-tokens"
                )
        return outputs

    def dump_state(self) -> dict[str, Any]:
        """DSPy's LM state without ``extra_headers``, which hold a server's basic auth (``user:password@``
        in ``--api-base``): DSPy leaves out ``api_key`` for the same reason, and tools that save a program's
        state (MLflow's DSPy autologging) must not write the password."""
        state = super().dump_state()
        state.pop("extra_headers", None)
        return state

    def update_history(self, entry: dict[str, Any]) -> None:
        super().update_history(entry)
        if entry.get("usage"):
            return  # a provider call: DSPy already reported its usage
        usage = response_usage(entry.get("response"))
        tracker = dspy.settings.usage_tracker
        if usage and tracker is not None and hasattr(tracker, "add_cached_usage"):
            tracker.add_cached_usage(self.model, usage)


__all__ = [
    "DEFAULT_MAX_RETRY_WAIT",
    "EndpointLM",
    "LMReplyTooLongError",
    "max_reply_chars",
    "response_usage",
    "retry_after_seconds",
    "retry_wait",
]
