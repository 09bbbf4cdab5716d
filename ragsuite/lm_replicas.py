"""One LM served by several OpenAI-compatible replicas, spread over them by LiteLLM's ``Router``.

Several vLLM servers serving the same model (one per GPU, or one per host) act as one LM: every request goes
through one ``litellm.Router`` holding one deployment per replica under the same model name, configured only
through the Router's documented constructor arguments and called through its public ``completion`` /
``acompletion``. The Router picks the replica with the fewest requests in flight (``least-busy``). A replica
that fails (5xx, 429, timeout, refused connection) is put in LiteLLM's cooldown at its first failure
(``allowed_fails=0``) for :data:`COOLDOWN_SECONDS` (at most ``--max-retry-wait``, and whatever ``Retry-After``
the replica sent), and the Router retries the same request at once on a replica that is not cooling down
(``num_retries``: one pass over the others). Errors that no other replica would answer differently (a refused
key, a bad request, an unknown model) are not retried. When every replica has failed, DSPy's own retry loop
waits and tries again, with the same capped, logged waits as a single server
(:class:`ragsuite.lm_client.EndpointLM`).

A refused connection counts: litellm reports it as an ``InternalServerError`` ("Connection error."), which the
Router cools down like a 500 (it skips cooldown only for errors named ``APIConnectionError``); checked on
litellm 1.106.2 and 1.110.2 by ``test_a_failing_replica_s_requests_move_to_another[down]``.

When every replica is down: after a failed attempt ragsuite opens a TCP connection to each replica, because
the Router's error names only the last replica it tried (and litellm 1.106 loses the cause of a refused
connection on the sync path). If none accepts, the attempt fails with a transport error naming every replica,
and a run stops with "cannot reach ..." instead of one "429, lower --threads" record per question. This only
reads the error; routing and failover stay the Router's.

``least-busy`` rather than LiteLLM's default ``simple-shuffle``: with 64 eval threads over 4 replicas that
each serve 4 requests at once, least-busy reached 0.96 of linear where random choice let queues grow on some
replicas while others idled (0.92); ``benchmarks/replicas.py --routing simple-shuffle``, ``docs/lms.md``.

The Router is DSPy's engine for the LM (``dspy.LM(engine=...)``, one Router call per DSPy attempt), so DSPy's
response cache, history, usage tracking and the request ledger work as for one server. Cached answers belong
to the set of replicas (not to one of them): any replica may have answered.

Every replica gets the same key (``--api-key-env``, or a placeholder); it is sent only to the replicas given.
A replica's ``user:password@`` becomes that replica's own basic ``Authorization`` header.

Tested with litellm 1.106.2 and 1.110.2, the range ``pyproject.toml`` allows (``docs/lms.md``).

Differences from the earlier Router setup (private hooks, gone in litellm 1.110):
    Earlier version did: replaced two private Router methods, so a retry skipped the replica that had just
        failed for that request only, the Router never waited, and a replica rested only after its second
        failure in a minute.
    ragsuite does: the Router's public settings only. The first failure puts the replica in cooldown, which
        keeps it out of the retry and out of every other request until the cooldown ends (5 s, or
        ``--max-retry-wait`` if shorter). While every replica is cooling down the Router answers at once and
        sends nothing; ragsuite reports that as a rate limit whose ``Retry-After`` is the cooldown, so DSPy's
        next (capped, logged) wait covers it, at the cost of one of its retries.
    Why: ragsuite uses LiteLLM's public API only (litellm 1.110 removed the helper and refuses subclasses of
        the Router). Measured by ``test_a_failed_replica_rests_then_serves_again``: after one 500, the failed
        replica got none of the next 5 requests and served again only once its cooldown (2 s there) had
        passed. With every replica saturated, each failure therefore idles that replica for the cooldown.

Example:
    >>> lm = replica_lm("openai/llama", ["http://gpu-1:8000/v1", "http://gpu-2:8000/v1"], api_key="EMPTY")
    >>> lm.replicas
    ('http://gpu-1:8000/v1', 'http://gpu-2:8000/v1')
"""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import Sequence
from typing import Any

from dspy import lm15
from dspy.clients.engines.base import validate_request
from dspy.clients.engines.litellm_errors import litellm_errors
from dspy.clients.lm15_boundary import request_kwargs, response_value

from ragsuite.lm_client import DEFAULT_MAX_RETRY_WAIT, EndpointLM
from ragsuite.redaction import PLACEHOLDER_KEY, SplitURL, split_url

#: How the Router picks a replica (see the module docstring for why not LiteLLM's default).
ROUTING_STRATEGY = "least-busy"
#: Seconds a replica that failed rests before it gets requests again (at most ``--max-retry-wait``).
COOLDOWN_SECONDS = 5.0
#: Failures a replica may have before it rests: none, so that the Router's retry goes to another replica.
ALLOWED_FAILS = 0
#: Failures after which ragsuite checks whether any replica still accepts connections.
FAILOVER_ERRORS = (lm15.RateLimitError, lm15.ServerError, lm15.TimeoutError, lm15.TransportError)
#: Seconds to wait for a replica to accept a TCP connection when every replica may be down.
PROBE_TIMEOUT = 2.0


def _split(replicas: Sequence[str | SplitURL]) -> tuple[SplitURL, ...]:
    """The replicas with their credentials split out (once, by :func:`ragsuite.redaction.split_url`) and
    registered for redaction: a ReplicaLM is also built from URLs directly, not only by ``build_lm``."""
    return tuple((url if isinstance(url, SplitURL) else split_url(url)).register() for url in replicas)


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _accepts(url: str, timeout: float) -> bool:
    try:
        with socket.create_connection(_address(url), timeout=timeout):
            return True
    except OSError:
        return False


async def _aaccepts(url: str, timeout: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*_address(url)), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def _make_router(
    model: str, replicas: Sequence[SplitURL], *, api_key: str | None, timeout: float, cooldown: float
) -> Any:
    import litellm

    deployments = []
    for replica in replicas:
        params: dict[str, Any] = {"model": model, "api_base": replica.address, "timeout": timeout}
        if api_key is not None:
            params["api_key"] = api_key
        if replica.authorization:
            params["extra_headers"] = {"Authorization": replica.authorization}
        # A deployment's own cooldown_time beats a Retry-After header: a replica asking for an hour must not
        # be left out for longer than DSPy's capped retry waits.
        info = {"id": replica.public, "cooldown_time": cooldown}
        deployments.append({"model_name": model, "litellm_params": params, "model_info": info})
    return litellm.Router(
        model_list=deployments,
        routing_strategy=ROUTING_STRATEGY,
        # One pass over the other replicas per DSPy attempt; the Router does not wait while one is left.
        num_retries=len(replicas) - 1,
        retry_after=0,
        allowed_fails=ALLOWED_FAILS,
        cooldown_time=cooldown,
        # One server has nowhere to fail over to: DSPy's retry loop does the waiting.
        disable_cooldowns=len(replicas) == 1,
    )


def _arguments(request: Any) -> dict[str, Any]:
    """The Router's arguments for a DSPy request (a chat completion, as DSPy's LiteLLM engine sends)."""
    validate_request(request)
    data = request_kwargs(request, "chat")
    if request.config.top_k is not None:
        data["top_k"] = request.config.top_k  # LiteLLM forwards it to servers that take it (vLLM does)
    # DSPy owns the response cache and the retries between attempts; the Router's retries are failover.
    data.update(model=request.model, n=1, cache={"no-cache": True, "no-store": True})
    return data


class _RouterEngineState:
    """What a saved LM keeps of its replicas: public URLs and the key's variable, never a key or password."""

    def __init__(
        self,
        *,
        model: str,
        replicas: Sequence[str | SplitURL],
        key_env: str | None,
        timeout: float,
        cooldown: float = COOLDOWN_SECONDS,
    ) -> None:
        self.model = model
        self.replicas = _split(replicas)
        self.key_env = key_env
        self.timeout = float(timeout)
        self.cooldown = float(cooldown)

    @property
    def _probe_timeout(self) -> float:
        return min(PROBE_TIMEOUT, self.timeout)

    def dump_state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "replicas": [replica.public for replica in self.replicas],
            "key_env": self.key_env,
            "timeout": self.timeout,
            "cooldown": self.cooldown,
        }

    def _resting(self, exc: Exception) -> Exception:
        """The Router's "no deployments available" (every replica cooling down, nothing sent) as a rate limit
        whose Retry-After is the cooldown, so that DSPy's (capped, logged) retry waits it out."""
        cooldown = getattr(exc, "cooldown_time", None)
        if type(exc).__name__ != "RouterRateLimitError" or cooldown is None:
            return exc
        return lm15.RateLimitError(
            f"every one of the {len(self.replicas)} replicas failed in the last {self.cooldown:g} s and is "
            f"resting; retry in {float(cooldown):g} s",
            status=429,
            retry_after=float(cooldown),
        )

    def _unreachable(self) -> lm15.TransportError:
        names = ", ".join(replica.public for replica in self.replicas)
        return lm15.TransportError(
            f"failed to connect to any of the {len(self.replicas)} replicas ({names}): connection refused or "
            "host unreachable"
        )


class RouterEngine(_RouterEngineState):
    """DSPy engine sending each attempt through a ``litellm.Router`` over the replicas."""

    def __init__(self, router: Any, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        self.router = router

    def complete(self, request: Any) -> Any:
        data = _arguments(request)
        try:
            with litellm_errors(model=request.model):
                try:
                    raw = self.router.completion(**data)
                except Exception as exc:
                    raise self._resting(exc) from exc
        except FAILOVER_ERRORS as exc:
            if not any(_accepts(replica.address, self._probe_timeout) for replica in self.replicas):
                raise self._unreachable() from exc
            raise
        return response_value(raw, "chat", request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError("streaming through several replicas is not supported")

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> RouterEngine:
        return _engines_from_state(state)[0]


class AsyncRouterEngine(_RouterEngineState):
    """The async counterpart of :class:`RouterEngine` (same Router)."""

    def __init__(self, router: Any, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        self.router = router

    async def complete(self, request: Any) -> Any:
        data = _arguments(request)
        try:
            with litellm_errors(model=request.model):
                try:
                    raw = await self.router.acompletion(**data)
                except Exception as exc:
                    raise self._resting(exc) from exc
        except FAILOVER_ERRORS as exc:
            probes = (_aaccepts(replica.address, self._probe_timeout) for replica in self.replicas)
            reachable = await asyncio.gather(*probes)
            if not any(reachable):
                raise self._unreachable() from exc
            raise
        return response_value(raw, "chat", request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError("streaming through several replicas is not supported")

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> AsyncRouterEngine:
        return _engines_from_state(state)[1]


def _engines_from_state(state: dict[str, Any]) -> tuple[RouterEngine, AsyncRouterEngine]:
    """Engines rebuilt from saved state; the key is read from the environment again."""
    import os

    key_env = state.get("key_env")
    key = os.environ.get(key_env) if key_env else PLACEHOLDER_KEY
    model = state.get("model") or ""
    return _engines(
        model,
        state["replicas"],
        api_key=key,
        key_env=key_env,
        timeout=state.get("timeout", 120.0),
        cooldown=state.get("cooldown", COOLDOWN_SECONDS),
    )


def _engines(
    model: str,
    replicas: Sequence[str | SplitURL],
    *,
    api_key: str | None,
    key_env: str | None,
    timeout: float,
    cooldown: float,
) -> tuple[RouterEngine, AsyncRouterEngine]:
    replicas = _split(replicas)
    router = _make_router(model, replicas, api_key=api_key, timeout=timeout, cooldown=cooldown)
    state = {
        "model": model,
        "replicas": replicas,
        "key_env": key_env,
        "timeout": timeout,
        "cooldown": cooldown,
    }
    return RouterEngine(router, **state), AsyncRouterEngine(router, **state)


class ReplicaLM(EndpointLM):
    """An :class:`EndpointLM` whose requests are spread over several replicas by a ``litellm.Router``.

    Args:
        model: The ``dspy.LM`` model string (``openai/SERVED_NAME``).
        replicas: The replicas' ``/v1`` URLs (``user:password@`` allowed), or a parsed spec's split ones
            (``LMSpec.endpoints``). ``build_lm`` makes a ReplicaLM for two or more; one is allowed (a Router
            over one server, for comparisons).
        api_key: The key every replica gets (None: none sent).
        key_env: The variable the key came from (kept when the LM's state is saved).
        timeout: Seconds per request before it fails over.
        max_retry_wait: Longest wait before a DSPy retry, in seconds; also the longest a failed replica
            rests (:data:`COOLDOWN_SECONDS` otherwise).
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
        replicas: Sequence[str | SplitURL] | None = None,
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
            timeout = engine.timeout
        elif not replicas:
            raise ValueError("ReplicaLM needs at least one replica")
        else:
            # A resting replica must be back by the time DSPy's longest wait is over.
            cooldown = min(COOLDOWN_SECONDS, float(max_retry_wait))
            engine, async_engine = _engines(
                model, replicas, api_key=api_key, key_env=key_env, timeout=timeout, cooldown=cooldown
            )
        public = tuple(replica.public for replica in engine.replicas)
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


def replica_lm(model: str, replicas: Sequence[str | SplitURL], **kwargs: Any) -> ReplicaLM:
    """Shorthand for :class:`ReplicaLM` (see its arguments)."""
    return ReplicaLM(model, replicas=replicas, **kwargs)


__all__ = [
    "ALLOWED_FAILS",
    "COOLDOWN_SECONDS",
    "FAILOVER_ERRORS",
    "ROUTING_STRATEGY",
    "AsyncRouterEngine",
    "ReplicaLM",
    "RouterEngine",
    "replica_lm",
]
