"""One LM served by several OpenAI-compatible replicas: each request goes to the least busy replica, and a
failed request moves to another replica at once.

Several vLLM servers serving the same model (one per GPU, or one per host) act as one LM. Every attempt DSPy
makes goes to the replica with the fewest requests in flight (ties go round the replicas in turn), through
that replica's own ``LiteLLMEngine`` (DSPy's engine over ``litellm.completion``, LiteLLM's public API). When
the replica fails (5xx, 429, timeout, refused connection) the same request goes to the next least busy replica
not yet tried, at once; one attempt tries each replica at most once. A replica failing more than
:data:`ALLOWED_FAILS` time(s) a minute rests for :data:`COOLDOWN_SECONDS` (it is tried only after the others).
Errors that no other replica would answer differently (a refused key, a bad request, an unknown model) are
raised at once. When every replica has failed, the attempt fails: DSPy's own retry loop waits and tries
again, with the same capped, logged waits as a single server (:class:`ragsuite.lm_client.EndpointLM`); when
every replica refused the connection, the error says which ones could not be reached, and a run stops.

Why not LiteLLM's ``Router``: its failover retries a deployment that just failed (and picks an idle, dead
replica first under least-busy) unless private hooks are replaced, and those hooks changed between releases
(litellm 1.110 dropped the helper ragsuite imported, then rewrote the Router). Picking a replica is a few
lines here; sending the request stays LiteLLM's. Tested with litellm 1.106.2 and 1.110.2 (the range
``pyproject.toml`` allows; see ``docs/replicas.md``).

``least-busy`` rather than random choice: with 64 eval threads over 4 replicas that each serve 4 requests at
once, least-busy kept the replicas evenly loaded (1.00 of linear) where random choice let queues grow on some
replicas while others idled (0.91); ``benchmarks/replicas.py --routing NAME``, ``docs/replicas.md``.

The pool is DSPy's engine for the LM (``dspy.LM(engine=...)``, one pass over the replicas per DSPy attempt),
so DSPy's response cache, history, usage tracking and the request ledger work as for one server. Cached
answers belong to the set of replicas (not to one of them): any replica may have answered.

Every replica gets the same key (``--api-key-env``, or a placeholder); it is sent only to the replicas given.
A replica's ``user:password@`` becomes that replica's own basic ``Authorization`` header.

Example:
    >>> lm = replica_lm("openai/llama", ["http://gpu-1:8000/v1", "http://gpu-2:8000/v1"], api_key="EMPTY")
    >>> lm.replicas
    ('http://gpu-1:8000/v1', 'http://gpu-2:8000/v1')
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from dspy import lm15
from dspy.clients.engines import AsyncLiteLLMEngine, LiteLLMEngine

from ragsuite.lm_client import DEFAULT_MAX_RETRY_WAIT, EndpointLM

log = logging.getLogger("ragsuite.lm")

#: How a replica is picked: ``least-busy`` (fewest requests in flight) or ``random``.
ROUTING_STRATEGY = "least-busy"
#: Seconds a replica that failed rests before it gets requests again.
COOLDOWN_SECONDS = 5.0
#: Failures a replica may have (per minute) before it rests.
ALLOWED_FAILS = 1
#: Failures another replica may not have: overload, a server error, a timeout, a dropped connection.
FAILOVER_ERRORS = (lm15.RateLimitError, lm15.ServerError, lm15.TimeoutError, lm15.TransportError)


def _public(url: str) -> str:
    from ragsuite.lm import strip_credentials

    return strip_credentials(url) or url


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a failure to connect: refused, unreachable, a
    name that does not resolve. LiteLLM reports these as HTTP 500 ``InternalServerError``."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionRefusedError) or type(error).__name__ in (
            "ConnectError",
            "ConnectTimeout",
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


class _Replica:
    """One replica: its engines, requests in flight and recent failures."""

    def __init__(self, url: str, *, model: str, api_key: str | None, timeout: float) -> None:
        from ragsuite.lm import split_url_credentials

        base, basic = split_url_credentials(url)
        options: dict[str, Any] = {"api_base": base, "timeout": timeout}
        if api_key is not None:
            options["api_key"] = api_key
        if basic:
            options["extra_headers"] = {"Authorization": basic}
        self.url = _public(url)
        self.engine = LiteLLMEngine(model_type="chat", **options)
        self.async_engine = AsyncLiteLLMEngine(model_type="chat", **options)
        self.in_flight = 0
        self.failures: collections.deque[float] = collections.deque()
        self.resting_until = 0.0


class ReplicaPool:
    """Picks a replica for each request and moves a failed request to the next one.

    Args:
        model: The model string (``openai/SERVED_NAME``).
        replicas: The replicas' ``/v1`` URLs (``user:password@`` allowed).
        api_key: The key every replica gets (None: none sent).
        timeout: Seconds per request before it fails over.
        strategy: ``least-busy`` or ``random`` (default :data:`ROUTING_STRATEGY`).
    """

    def __init__(
        self,
        model: str,
        replicas: Sequence[str],
        *,
        api_key: str | None,
        timeout: float,
        strategy: str | None = None,
    ) -> None:
        self.strategy = strategy or ROUTING_STRATEGY
        if self.strategy not in ("least-busy", "random"):
            raise ValueError(f"unknown routing strategy {self.strategy!r}: least-busy or random")
        self.replicas = [_Replica(url, model=model, api_key=api_key, timeout=timeout) for url in replicas]
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def _acquire(self, tried: set[int]) -> _Replica | None:
        """The replica to try next (counted in flight), or None when every one was tried."""
        now = time.monotonic()
        with self._lock:
            candidates = [i for i in range(len(self.replicas)) if i not in tried]
            if not candidates:
                return None
            turn = next(self._turn)
            size = len(self.replicas)

            def rank(i: int) -> tuple[bool, float, int]:
                replica = self.replicas[i]
                # Resting replicas last; then the least busy (or a random one); ties in turn.
                load = replica.in_flight if self.strategy == "least-busy" else random.random()
                return (replica.resting_until > now, load, (i - turn) % size)

            index = min(candidates, key=rank)
            tried.add(index)
            replica = self.replicas[index]
            replica.in_flight += 1
            return replica

    def _release(self, replica: _Replica, error: BaseException | None) -> None:
        now = time.monotonic()
        with self._lock:
            replica.in_flight -= 1
            if error is None:
                return
            replica.failures.append(now)
            while replica.failures and replica.failures[0] < now - 60.0:
                replica.failures.popleft()
            if len(replica.failures) > ALLOWED_FAILS:
                replica.resting_until = now + COOLDOWN_SECONDS
        log.debug("replica %s failed (%s); trying another", replica.url, type(error).__name__)

    def _all_failed(self, failures: list[tuple[_Replica, BaseException]]) -> BaseException:
        """The error of an attempt that failed on every replica."""
        if all(_refused(exc) for _, exc in failures):
            names = ", ".join(replica.url for replica, _ in failures)
            return lm15.TransportError(
                f"failed to connect to any of the {len(failures)} replicas ({names}): connection refused or "
                "host unreachable"
            )
        # A 429 carries the Retry-After that DSPy's (capped) wait honours.
        limited = [exc for _, exc in failures if isinstance(exc, lm15.RateLimitError)]
        return (limited or [failures[-1][1]])[-1]

    def complete(self, request: Any) -> Any:
        failures: list[tuple[_Replica, BaseException]] = []
        tried: set[int] = set()
        while (replica := self._acquire(tried)) is not None:
            error: BaseException | None = None
            try:
                return replica.engine.complete(request)
            except FAILOVER_ERRORS as exc:
                error = exc
                failures.append((replica, exc))
            finally:
                self._release(replica, error)
        raise self._all_failed(failures)

    async def acomplete(self, request: Any) -> Any:
        failures: list[tuple[_Replica, BaseException]] = []
        tried: set[int] = set()
        while (replica := self._acquire(tried)) is not None:
            error: BaseException | None = None
            try:
                return await replica.async_engine.complete(request)
            except FAILOVER_ERRORS as exc:
                error = exc
                failures.append((replica, exc))
            finally:
                self._release(replica, error)
        raise self._all_failed(failures)


class _RouterEngineState:
    """What a saved LM keeps of its replicas: public URLs and the key's variable, never a key or password."""

    def __init__(self, *, model: str, replicas: Sequence[str], key_env: str | None, timeout: float) -> None:
        self.model = model
        self.replicas = tuple(replicas)
        self.key_env = key_env
        self.timeout = float(timeout)

    def dump_state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "replicas": [_public(url) for url in self.replicas],
            "key_env": self.key_env,
            "timeout": self.timeout,
        }


class RouterEngine(_RouterEngineState):
    """DSPy engine sending each attempt to the replicas of a :class:`ReplicaPool`."""

    def __init__(self, pool: ReplicaPool, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        self.pool = pool

    def complete(self, request: Any) -> Any:
        return self.pool.complete(request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError("streaming through several replicas is not supported")

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> RouterEngine:
        return _engines_from_state(state)[0]


class AsyncRouterEngine(_RouterEngineState):
    """The async counterpart of :class:`RouterEngine` (same pool)."""

    def __init__(self, pool: ReplicaPool, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        self.pool = pool

    async def complete(self, request: Any) -> Any:
        return await self.pool.acomplete(request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError("streaming through several replicas is not supported")

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> AsyncRouterEngine:
        return _engines_from_state(state)[1]


def _engines_from_state(state: dict[str, Any]) -> tuple[RouterEngine, AsyncRouterEngine]:
    """Engines rebuilt from saved state; the key is read from the environment again."""
    import os

    from ragsuite.lm import PLACEHOLDER_KEY

    key_env = state.get("key_env")
    key = os.environ.get(key_env) if key_env else PLACEHOLDER_KEY
    model = state.get("model") or ""
    return _engines(
        model, state["replicas"], api_key=key, key_env=key_env, timeout=state.get("timeout", 120.0)
    )


def _engines(
    model: str, replicas: Sequence[str], *, api_key: str | None, key_env: str | None, timeout: float
) -> tuple[RouterEngine, AsyncRouterEngine]:
    pool = ReplicaPool(model, replicas, api_key=api_key, timeout=timeout)
    state = {"model": model, "replicas": replicas, "key_env": key_env, "timeout": timeout}
    return RouterEngine(pool, **state), AsyncRouterEngine(pool, **state)


class ReplicaLM(EndpointLM):
    """An :class:`EndpointLM` whose requests are spread over several replicas by a :class:`ReplicaPool`.

    Args:
        model: The ``dspy.LM`` model string (``openai/SERVED_NAME``).
        replicas: The replicas' ``/v1`` URLs (``user:password@`` allowed). ``build_lm`` makes a ReplicaLM for
            two or more; one is allowed (a pool of one server, for comparisons).
        api_key: The key every replica gets (None: none sent).
        key_env: The variable the key came from (kept when the LM's state is saved).
        timeout: Seconds per request before it fails over.
        max_retry_wait: Longest wait before a DSPy retry, in seconds.
        engine: With ``async_engine``, the engines rebuilt from a saved state (``dspy.BaseLM.load_state``)
            in place of ``replicas``; the key is read from ``key_env`` again, a password is not saved.
        async_engine: See ``engine``.
        **kwargs: As for ``dspy.LM`` (temperature, max_tokens, num_retries, cache, seed, ...).

    Example:
        >>> lm = ReplicaLM("openai/llama", replicas=["http://gpu-1:8000/v1", "http://gpu-2:8000/v1"])
    """

    def __init__(
        self,
        model: str,
        *,
        replicas: Sequence[str] | None = None,
        api_key: str | None = None,
        key_env: str | None = None,
        timeout: float = 120.0,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        engine: RouterEngine | None = None,
        async_engine: AsyncRouterEngine | None = None,
        **kwargs: Any,
    ) -> None:
        if engine is not None:  # loaded from a saved state, which rebuilt the engines
            if not isinstance(engine, RouterEngine) or not isinstance(async_engine, AsyncRouterEngine):
                raise TypeError("ReplicaLM's engines are a RouterEngine and an AsyncRouterEngine")
            replicas, timeout = engine.replicas, engine.timeout
        elif not replicas:
            raise ValueError("ReplicaLM needs at least one replica")
        else:
            engine, async_engine = _engines(
                model, replicas, api_key=api_key, key_env=key_env, timeout=timeout
            )
        public = tuple(_public(url) for url in replicas)
        super().__init__(
            model,
            cache_scope="replicas:" + ",".join(sorted(public)),
            max_retry_wait=max_retry_wait,
            engine=engine,
            async_engine=async_engine,
            **kwargs,
        )
        self.replicas = public
        self.timeout = float(timeout)


def replica_lm(model: str, replicas: Sequence[str], **kwargs: Any) -> ReplicaLM:
    """Shorthand for :class:`ReplicaLM` (see its arguments)."""
    return ReplicaLM(model, replicas=replicas, **kwargs)


__all__ = [
    "ALLOWED_FAILS",
    "COOLDOWN_SECONDS",
    "FAILOVER_ERRORS",
    "ROUTING_STRATEGY",
    "AsyncRouterEngine",
    "ReplicaLM",
    "ReplicaPool",
    "RouterEngine",
    "replica_lm",
]
