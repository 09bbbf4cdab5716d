"""One LM served by several OpenAI-compatible replicas, spread over them by LiteLLM's ``Router``.

Several vLLM servers serving the same model (one per GPU, or one per host) act as one LM: every request goes
through one ``litellm.Router`` holding one deployment per replica under the same model name. The Router picks
the replica with the fewest requests in flight (its ``least-busy`` strategy) and, when a replica fails (5xx,
429, timeout, refused connection), sends the same request to another replica at once. A replica failing more
than :data:`ALLOWED_FAILS` time(s) a minute rests for :data:`COOLDOWN_SECONDS` (LiteLLM's cooldown, which
ignores refused connections). When every replica has failed, DSPy's own retry loop waits and tries again,
with the same capped, logged waits as a single server (:class:`ragsuite.lm_client.EndpointLM`).

``least-busy`` rather than LiteLLM's default ``simple-shuffle``: with 64 eval threads over 4 replicas that
each serve 4 requests at once, least-busy kept the replicas evenly loaded (0.96 of linear) where random choice
let queues grow on some replicas while others idled (0.86); ``benchmarks/replicas.py --routing NAME``.

The Router is DSPy's engine for the LM (``dspy.LM(engine=...)``, one attempt per DSPy attempt), so DSPy's
response cache, history, usage tracking and the request ledger work as for one server. Cached answers belong
to the set of replicas (not to one of them): any replica may have answered.

Every replica gets the same key (``--api-key-env``, or a placeholder); it is sent only to the replicas given.
A replica's ``user:password@`` becomes that replica's own basic ``Authorization`` header.

Example:
    >>> lm = replica_lm("openai/llama", ["http://gpu-1:8000/v1", "http://gpu-2:8000/v1"], api_key="EMPTY")
    >>> lm.replicas
    ('http://gpu-1:8000/v1', 'http://gpu-2:8000/v1')
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from dspy.clients.engines.litellm_engine import AsyncLiteLLMEngine, LiteLLMEngine
from dspy.clients.engines.litellm_errors import litellm_errors

from ragsuite.lm_client import DEFAULT_MAX_RETRY_WAIT, EndpointLM

log = logging.getLogger("ragsuite.lm")

#: How the Router picks a replica (see the module docstring for why not the default).
ROUTING_STRATEGY = "least-busy"
#: Seconds a replica that failed rests before it gets requests again.
COOLDOWN_SECONDS = 5.0
#: Failures a replica may have (per minute) before it rests.
ALLOWED_FAILS = 1


def _public(url: str) -> str:
    from ragsuite.lm import strip_credentials

    return strip_credentials(url) or url


def _make_router(model: str, replicas: Sequence[str], *, api_key: str | None, timeout: float) -> Any:
    import litellm
    from litellm.router import _as_retry_skipped_deployment_ids

    from ragsuite.lm import split_url_credentials

    class FailoverRouter(litellm.Router):
        """The Router moves a failed request to another replica at once.

        LiteLLM skips a deployment on retry only after a non-retryable answer; here every failure (5xx, 429,
        timeout, refused connection) skips it, so a retry reaches another replica while one is left (LiteLLM
        falls back to all of them when none is). LiteLLM never rests a replica for a refused connection, and
        least-busy would pick the idle, dead one first. Every wait belongs to DSPy's retry loop, where
        ``--max-retry-wait`` caps it and each one is logged."""

        @staticmethod
        def _deployment_ids_to_skip_on_retry(
            exception: Exception, already_skipped: object
        ) -> tuple[str, ...]:
            failed = getattr(exception, "retry_skip_deployment_id", None) or getattr(
                exception, "failed_deployment_id", None
            )
            if not failed:
                return ()
            return tuple(sorted({*_as_retry_skipped_deployment_ids(already_skipped), str(failed)}))

        def _time_to_sleep_before_retry(self, *args: Any, **kwargs: Any) -> float:
            return 0.0

    deployments = []
    for url in replicas:
        base, basic = split_url_credentials(url)
        params: dict[str, Any] = {"model": model, "api_base": base, "timeout": timeout}
        if api_key is not None:
            params["api_key"] = api_key
        if basic:
            params["extra_headers"] = {"Authorization": basic}
        deployments.append(
            {"model_name": model, "litellm_params": params, "model_info": {"id": _public(url)}}
        )
    return FailoverRouter(
        model_list=deployments,
        routing_strategy=ROUTING_STRATEGY,
        # One pass over the other replicas per DSPy attempt.
        num_retries=len(replicas) - 1,
        allowed_fails=ALLOWED_FAILS,
        cooldown_time=COOLDOWN_SECONDS,
    )


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


class RouterEngine(_RouterEngineState, LiteLLMEngine):
    """DSPy engine sending each attempt through a ``litellm.Router`` over the replicas."""

    # Every call goes through complete(Request); the inherited shortcut would call litellm directly.
    complete_legacy = None

    def __init__(self, router: Any, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        LiteLLMEngine.__init__(self, model_type="chat")
        self.router = router

    def complete(self, request: Any) -> Any:
        data = self._arguments(request)
        # DSPy's engine asks LiteLLM for no retries; the Router's own (one per other replica) are failover.
        data.pop("num_retries", None)
        with litellm_errors(model=request.model):
            raw = self.router.completion(**data)
        return self._response(raw, request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError("streaming through several replicas is not supported")

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> RouterEngine:
        return _engines_from_state(state)[0]


class AsyncRouterEngine(_RouterEngineState, AsyncLiteLLMEngine):
    """The async counterpart of :class:`RouterEngine` (same Router)."""

    complete_legacy = None

    def __init__(self, router: Any, **state: Any) -> None:
        _RouterEngineState.__init__(self, **state)
        AsyncLiteLLMEngine.__init__(self, model_type="chat")
        self.router = router

    async def complete(self, request: Any) -> Any:
        data = self._arguments(request)
        # DSPy's engine asks LiteLLM for no retries; the Router's own (one per other replica) are failover.
        data.pop("num_retries", None)
        with litellm_errors(model=request.model):
            raw = await self.router.acompletion(**data)
        return self._response(raw, request)

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
    router = _make_router(model, replicas, api_key=api_key, timeout=timeout)
    state = {"model": model, "replicas": replicas, "key_env": key_env, "timeout": timeout}
    return RouterEngine(router, **state), AsyncRouterEngine(router, **state)


class ReplicaLM(EndpointLM):
    """An :class:`EndpointLM` whose requests are spread over several replicas by a ``litellm.Router``.

    Args:
        model: The ``dspy.LM`` model string (``openai/SERVED_NAME``).
        replicas: The replicas' ``/v1`` URLs (``user:password@`` allowed). ``build_lm`` makes a ReplicaLM for
            two or more; one is allowed (a Router over one server, for comparisons).
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
    "COOLDOWN_SECONDS",
    "ROUTING_STRATEGY",
    "AsyncRouterEngine",
    "ReplicaLM",
    "RouterEngine",
    "replica_lm",
]
