"""``--mlflow [URI]`` on ``eval``, ``compile`` and ``tune``: an MLflow run per command, DSPy autologging on.

MLflow's DSPy integration (``mlflow.dspy.autolog``) traces every program, module, adapter and LM call, during
compiles and evaluations as well, and logs DSPy's compiles and evaluations (an optimizer's candidate
scores, the compiled program's state). ragsuite logs the command's own record beside it: parameters (program,
dataset, slices, LM settings, knobs as ``knob.NAME``, optimizer options as ``option.NAME``), metrics (the
numbers the command prints and saves), the output directory as the ``ragsuite.out`` tag, and small JSON
outputs (``summary.json``, ``manifest.json``, the program file, ``best.json``) as artifacts.

Nothing secret is logged: parameters are redacted (:func:`ragsuite.redaction.redact`: key-shaped strings,
``Basic``/``Bearer`` tokens, the values of ``*_API_KEY``/``*TOKEN*`` variables and of the key variable in
use, ``user:password@`` in URLs and every form of a configured URL's password), DSPy LM state loses its
headers (a server's basic auth) as MLflow already drops ``api_key`` and ``api_base`` from it, and every
trace span is redacted before MLflow exports it (:func:`redact_span`): its inputs, outputs, attributes,
status and exception events, whose messages quote whatever a server echoed.

The tracking URI is ``--mlflow URI`` when given, else ``$MLFLOW_TRACKING_URI``, else MLflow's default
(``sqlite:///mlflow.db`` in the working directory); the experiment is ``$MLFLOW_EXPERIMENT_NAME`` or
``ragsuite``.

Example:
    ragsuite eval --program vanilla --dataset hotpotqa --lm openai/gpt-4o-mini --limit 50 --out runs/v \\
        --mlflow sqlite:///mlruns.db
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError, RagsuiteError, install_hint

log = logging.getLogger("ragsuite.cli.mlflow")

DEFAULT_EXPERIMENT = "ragsuite"
#: MLflow's limit on a parameter's value.
MAX_PARAM_CHARS = 6000
#: Parameter names (their last part) that are never logged, whatever their value.
_SECRET_NAME = re.compile(
    r"((^|_)(api_?key|key|token|secret|password|passwd)$|authorization|headers?$)", re.IGNORECASE
)
#: LM settings that MLflow's DSPy integration must drop from span attributes and logged LM state (it drops
#: api_key and api_base itself); ragsuite puts a server's basic auth (``user:password@`` in --api-base) here.
_LM_SECRET_SETTINGS = ("extra_headers", "headers")


def add_mlflow_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mlflow",
        nargs="?",
        const="",
        default=None,
        metavar="URI",
        help="log this run to MLflow with DSPy autologging (traces of every LM call, params, knobs, "
        "metrics); URI defaults to $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here; "
        f"needs {install_hint('mlflow')}",
    )


def require_mlflow() -> Any:
    """The ``mlflow`` module, or a ConfigError naming the extra that installs it."""
    try:
        import mlflow
        import mlflow.dspy  # the DSPy flavor: autologging
    except ImportError as exc:
        raise ConfigError(f"--mlflow needs MLflow ({exc}); install it with {install_hint('mlflow')}") from exc
    return mlflow


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"lm": {"model": "m"}}`` -> ``{"lm.model": "m"}``; lists and other values are kept as they are.

    Example:
        >>> flatten({"lm": {"model": "m", "seed": 0}, "knobs": {}})
        {'lm.model': 'm', 'lm.seed': 0}
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def public_params(values: Mapping[str, Any]) -> dict[str, str]:
    """Flattened parameters as MLflow keeps them: text, redacted, ``None`` left out, secret-named keys too.

    Example:
        >>> public_params({"lm": {"api_base": "http://u:p@h/v1", "api_key": "x"}, "limit": None})
        {'lm.api_base': 'http://***@h/v1'}
    """
    from ragsuite.lm import redact

    params = {}
    for key, value in flatten(values).items():
        if value is None or _SECRET_NAME.search(key.rsplit(".", 1)[-1]):
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        name = re.sub(r"[^\w\-. /]", "_", key)[:250]
        params[name] = redact(text)[:MAX_PARAM_CHARS]
    return params


def numeric_metrics(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers among flattened ``values`` (``None``, text and booleans left out: never logged as 0)."""
    return {
        f"{prefix}{key}": float(value)
        for key, value in flatten(values).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class MlflowRun:
    """The MLflow run of one command; its methods turn MLflow's errors into :class:`RagsuiteError`."""

    def __init__(self, mlflow: Any, run: Any) -> None:
        self._mlflow = mlflow
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id

    def log_params(self, values: Mapping[str, Any]) -> None:
        params = public_params(values)
        if params:
            self._call("log params", self._mlflow.log_params, params)

    def log_metrics(self, values: Mapping[str, float], *, step: int | None = None) -> None:
        if values:
            self._call("log metrics", self._mlflow.log_metrics, dict(values), step=step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._call("set tags", self._mlflow.set_tags, public_params(tags))

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        if Path(path).is_file():
            self._call("log an artifact", self._mlflow.log_artifact, str(path), artifact_path=artifact_path)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            from ragsuite.lm import redact

            raise RagsuiteError(f"MLflow could not {what}: {redact(str(exc))[:1000]}") from exc


def redact_span(span: Any) -> None:
    """An MLflow span processor (``mlflow.tracing.configure(span_processors=...)``): redact every string the
    span will be exported with, before it is exported.

    MLflow keeps inputs, outputs and attributes as JSON text in the OpenTelemetry span's attributes, and an
    exception as an ``exception`` event (message and stack trace) with the status description; the LM's
    exception messages quote whatever the server echoed, a key or an ``Authorization`` header included.
    """
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util import BoundedList
    from opentelemetry.trace import Status

    from ragsuite.redaction import redact, redact_value

    otel = span._span  # the OpenTelemetry span MLflow exports (LiveSpan has no API for events)
    for key, value in dict(otel.attributes or {}).items():
        clean = redact_value(value)
        if clean != value:
            otel.set_attribute(key, clean)
    events = list(otel.events)
    cleaned = [Event(e.name, redact_value(dict(e.attributes or {})), e.timestamp) for e in events]
    if any(
        dict(a.attributes or {}) != dict(b.attributes or {}) for a, b in zip(events, cleaned, strict=True)
    ):
        otel._events = BoundedList.from_seq(otel._events._dq.maxlen, cleaned)
    status = otel.status
    if status.description and redact(status.description) != status.description:
        otel.set_status(Status(status.status_code, redact(status.description)))


def _hide_lm_headers() -> None:
    """Make MLflow's DSPy integration drop LM headers (a basic-auth password) like it drops API keys."""
    from mlflow.dspy import util

    excluded = getattr(util, "EXCLUDE_LM_PARAMS", None)
    if not isinstance(excluded, set):
        raise ConfigError(
            "this MLflow version's DSPy integration cannot be told to drop LM headers; install the "
            f"version the extra pins with {install_hint('mlflow')}"
        )
    excluded.update(_LM_SECRET_SETTINGS)


@contextlib.contextmanager
def mlflow_run(uri: str | None, *, run_name: str, command: str) -> Iterator[MlflowRun | None]:
    """An MLflow run with DSPy autologging for the command's duration; ``None`` when ``uri`` is None.

    Args:
        uri: ``--mlflow``'s value: None (off), ``""`` (the default store) or a tracking URI.
        run_name: The run's name in the MLflow UI.
        command: ``eval``, ``compile`` or ``tune`` (the ``ragsuite.command`` tag).

    Raises:
        ConfigError: MLflow is not installed, or the tracking store cannot be opened.
    """
    if uri is None:
        yield None
        return
    mlflow = require_mlflow()
    import dspy

    from ragsuite.lm import redact

    _hide_lm_headers()
    if uri:
        mlflow.set_tracking_uri(uri)
    shown = redact(mlflow.get_tracking_uri())
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    try:
        mlflow.set_experiment(experiment)
    except Exception as exc:
        hint = ""
        if shown.startswith("file:") or "://" not in shown:
            hint = "; MLflow now stores runs in a database: use --mlflow sqlite:///PATH/mlflow.db"
        raise ConfigError(
            f"cannot open the MLflow tracking store {shown}: {redact(str(exc))[:500]}{hint}"
        ) from exc
    track_usage = dspy.settings.get("track_usage")
    from mlflow.tracing.config import get_config

    # Last, so that it sees what the user's own processors leave.
    redacting = mlflow.tracing.configure(span_processors=[*get_config().span_processors, redact_span])
    mlflow.dspy.autolog(
        log_traces=True,
        log_traces_from_compile=True,
        log_traces_from_eval=True,
        log_compiles=True,
        log_evals=True,
        silent=True,
    )
    try:
        with mlflow.start_run(run_name=run_name) as run:
            handle = MlflowRun(mlflow, run)
            handle.set_tags({"ragsuite.command": command})
            print(f"MLflow: run {handle.run_id} in experiment {experiment!r} at {shown}")
            try:
                yield handle
            finally:
                mlflow.flush_trace_async_logging()
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)
        dspy.settings.configure(track_usage=track_usage)
        redacting.__exit__(None, None, None)  # the processors as they were


def lm_params(lm_public: Mapping[str, Any]) -> dict[str, Any]:
    """The LM part of a manifest as parameters: ``lm.*`` and ``stage_lm.STAGE.*``."""
    return {"lm": lm_public.get("lm") or {}, "stage_lm": lm_public.get("stage_lms") or {}}


__all__ = [
    "MlflowRun",
    "add_mlflow_argument",
    "flatten",
    "lm_params",
    "mlflow_run",
    "numeric_metrics",
    "public_params",
    "redact_span",
    "require_mlflow",
]
