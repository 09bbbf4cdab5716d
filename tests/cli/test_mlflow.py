"""``--mlflow`` on eval, compile and tune: read back from a local SQLite MLflow store in tmp_path (offline).

Every run here is against a server behind basic auth (``user:password@`` in --api-base) with OPENAI_API_KEY
set and sent, and the whole store (database and artifact files) is then searched for both."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import pytest

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.errors import install_hint
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder

PASSWORD = "s3cret-pass"
API_KEY = "sk-mlflowtest-0123456789abcdefghij"
BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty SQLite MLflow store, made once: creating its tables takes MLflow several seconds."""
    mlflow = pytest.importorskip("mlflow", reason="needs the mlflow extra: " + install_hint("mlflow"))
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch, empty_store: Path) -> str:
    """A SQLite store in tmp_path, a copy of the empty one; run artifacts land in tmp_path/mlruns (MLflow's
    default beside the cwd, which is tmp_path). OPENAI_API_KEY is set, MLflow's own settings are not."""
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def gold() -> dict[str, str]:
    """The fixture HotpotQA questions, each with its gold answer."""
    return {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}


def _lm_flags(server: LocalOpenAIServer) -> list[str]:
    base = server.api_base.replace("http://", f"http://alice:{PASSWORD}@")
    return ["--lm", "openai/scripted", "--api-base", base, "--api-key-env", "OPENAI_API_KEY", "--no-cache"]


def _runs(uri: str) -> tuple[object, list]:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ragsuite")
    return client, client.search_runs([experiment.experiment_id])


def _assert_no_secret_anywhere(tmp_path: Path, runs: list) -> None:
    for run in runs:
        text = json.dumps({"params": run.data.params, "tags": run.data.tags})
        for secret in (PASSWORD, BASIC, API_KEY):
            assert secret not in text, (run.info.run_name, secret)
    files = [tmp_path / "mlflow.db", *(tmp_path / "mlruns").rglob("*")]
    assert (tmp_path / "mlflow.db").is_file()
    for path in files:
        if path.is_file():
            data = path.read_bytes()
            for secret in (PASSWORD, BASIC, API_KEY):
                assert secret.encode() not in data, (path, secret)


def _traces(client, run) -> list:
    import mlflow

    mlflow.flush_trace_async_logging()
    traces = client.search_traces(locations=[run.info.experiment_id], max_results=500)
    return [t for t in traces if t.info.request_metadata.get("mlflow.sourceRun") == run.info.run_id]


def test_eval_logs_params_metrics_run_dir_and_a_trace_per_question(tmp_path, capsys, tracking_uri, gold):
    out = tmp_path / "run"
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--limit", "3", "--set", "top_k=4"]
        code = main([*argv, "--no-progress", "--out", str(out), "--mlflow", tracking_uri, *_lm_flags(server)])
        assert code == 0
        assert set(server.authorizations) == {f"Basic {BASIC}"}  # the password was used...
        endpoint = server.api_base
    assert PASSWORD not in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    client, runs = _runs(tracking_uri)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    params, metrics = run.data.params, run.data.metrics
    assert params["program"] == "vanilla" and params["dataset"] == "hotpotqa" and params["limit"] == "3"
    assert params["knob.top_k"] == "4" and params["lm.model"] == "openai/scripted"
    assert params["lm.api_base"] == endpoint  # ...but the endpoint is logged without it
    for name, value in summary["metrics"].items():
        assert metrics[name] == pytest.approx(value), name
    for name, value in summary["cost"].items():
        assert metrics[f"cost.{name}"] == pytest.approx(value), name
    assert metrics["n"] == summary["n"] == 3 and metrics["errors"] == 0
    assert metrics["retrieval_recall"] == pytest.approx(summary["retrieval_recall"])
    assert run.data.tags["ragsuite.out"] == str(out.resolve())
    assert run.data.tags["ragsuite.command"] == "eval"
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "run")}
    assert logged == {"run/summary.json", "run/manifest.json"}
    traces = _traces(client, run)
    assert len(traces) == 3  # one per question, each holding its program, adapter and LM spans
    lm_spans = [s for t in traces for s in t.data.spans if s.span_type == "CHAT_MODEL"]
    assert len(lm_spans) == 3 * summary["cost"]["lm_calls"]
    _assert_no_secret_anywhere(tmp_path, runs)


@pytest.mark.slow
def test_compile_logs_scores_options_and_the_program_file_with_traces(
    tmp_path, tracking_uri, tiny_dataset, answers_no, compile_args
):
    data = tiny_dataset(tmp_path / "data")
    out = tmp_path / "compiled.json"
    with LocalOpenAIServer(answers_no) as server:
        gepa = ["--teacher-lm", "openai/scripted", "--no-progress", "--max-metric-calls", "20"]
        argv = compile_args(data, out, *gepa, "--mlflow", tracking_uri, *_lm_flags(server), optimizer="gepa")
        assert main(argv) == 0
    saved = json.loads(out.read_text())["metadata"]
    client, runs = _runs(tracking_uri)
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(top) == 1
    run = top[0]
    params, metrics = run.data.params, run.data.metrics
    assert params["optimizer"] == "gepa" and params["train"] == "2" and params["val"] == "3"
    assert params["option.max_metric_calls"] == "20" and params["teacher_lm"] == "openai/scripted"
    assert params["option.log_dir"] == str(tmp_path / "compiled.gepa")
    for label in ("baseline", "compiled"):
        assert metrics[f"{label}.score"] == pytest.approx(saved["metrics"][label]["score"])
        assert metrics[f"{label}.errors"] == saved["metrics"][label]["errors"]
    assert run.data.tags["ragsuite.out"] == str(out.resolve())
    assert run.data.tags["ragsuite.gepa_log_dir"] == str((tmp_path / "compiled.gepa").resolve())
    assert {a.path for a in client.list_artifacts(run.info.run_id, "program")} == {"program/compiled.json"}
    # DSPy autologging: the compile's own record (the best program's state), GEPA's full evaluations as
    # nested runs (each with the LM's settings, headers left out) and traces of its LM calls.
    assert "best_model.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert nested and all("openai/scripted" in r.data.params["lm_params"] for r in nested)
    assert all("eval" in r.data.metrics for r in nested)
    assert any(s.span_type == "CHAT_MODEL" for t in _traces(client, run) for s in t.data.spans)
    _assert_no_secret_anywhere(tmp_path, runs)


@pytest.mark.slow
def test_tune_logs_every_trial_and_the_written_one(tmp_path, tracking_uri, gold):
    out = tmp_path / "tune"
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        argv = ["tune", "--program", "vanilla", "--dataset", "hotpotqa", "--trials", "3", "--val", "3"]
        argv += ["--objectives", "quality,lm_calls", "--threads", "2", "--no-progress", "--out", str(out)]
        assert main([*argv, "--mlflow", tracking_uri, *_lm_flags(server)]) == 0
    study_dir = out / "vanilla-hotpotqa-quality+lm_calls"
    trials = json.loads((study_dir / "trials.json").read_text())
    best = json.loads((study_dir / "best.json").read_text())
    client, runs = _runs(tracking_uri)
    assert len(runs) == 1
    run = runs[0]
    history = client.get_metric_history(run.info.run_id, "trial.quality")
    assert {m.step: m.value for m in history} == {
        t["number"]: pytest.approx(t["values"][0]) for t in trials if t["state"] == "COMPLETE"
    }
    assert run.data.params["written_trial"] == str(best["metadata"]["tuning"]["trial"])
    assert run.data.params["knob.top_k"] == str(best["knobs"]["top_k"])
    assert run.data.params["objectives"] == "quality,lm_calls"
    assert "study/best.json" in {a.path for a in client.list_artifacts(run.info.run_id, "study")}
    assert _traces(client, run)
    _assert_no_secret_anywhere(tmp_path, runs)


def test_mlflow_without_the_extra_names_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` now fails as if it were not installed
    lm = ["--lm", "openai/scripted", "--api-base", "http://127.0.0.1:9/v1"]
    commands = (
        ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--out"],
        ["compile", "--program", "vanilla", "--dataset", "hotpotqa", "--optimizer", "bootstrap", "--out"],
        ["tune", "--program", "vanilla", "--dataset", "hotpotqa", "--trials", "1", "--out"],
    )
    for argv in commands:
        assert main([*argv, str(tmp_path / argv[0]), "--mlflow", *lm]) == 2, argv[0]
        err = capsys.readouterr().err
        assert "--mlflow needs MLflow" in err and install_hint("mlflow") in err, argv[0]
        assert "[mlflow]" in install_hint("mlflow")
    assert not list(tmp_path.iterdir())  # refused before anything ran or was written


def test_a_file_store_uri_is_refused_with_the_sqlite_form(tmp_path, monkeypatch, capsys, gold):
    pytest.importorskip("mlflow", reason="needs the mlflow extra: " + install_hint("mlflow"))
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--limit", "1", "--no-progress"]
        argv += ["--out", str(tmp_path / "run"), "--mlflow", f"file:{tmp_path / 'mlruns'}"]
        assert main([*argv, "--lm", "openai/scripted", "--api-base", server.api_base]) == 2
    assert "use --mlflow sqlite:///PATH/mlflow.db" in capsys.readouterr().err


def test_params_are_redacted_and_secret_named_settings_left_out(monkeypatch):
    from ragsuite.cli.mlflow_tracking import numeric_metrics, public_params

    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    params = public_params(
        {
            "lm": {
                "api_base": f"http://alice:{PASSWORD}@host/v1",
                "api_key": "anything",
                "extra_headers": {"Authorization": f"Basic {BASIC}"},
                "max_tokens": 512,
                "key_env": "OPENAI_API_KEY",
            },
            "note": f"failed with {API_KEY}",
            "limit": None,
        }
    )
    assert params == {
        "lm.api_base": "http://***@host/v1",
        "lm.max_tokens": "512",
        "lm.key_env": "OPENAI_API_KEY",
        "note": "failed with ***",
    }
    assert numeric_metrics({"a": {"b": 0.5, "c": None, "d": True}, "n": 3}) == {"a.b": 0.5, "n": 3.0}


def test_a_server_echoing_the_key_and_basic_auth_leaks_them_to_no_sink(
    tmp_path, monkeypatch, capsys, tracking_uri, gold
):
    """A server that quotes the request's key and Authorization header in its error (some proxies do): the
    exception reached MLflow's trace (event message, stack trace, status) raw, while the run's records showed
    ``key=***``; the Basic token reached records.jsonl, the HTML report and stderr. The password holds an
    ``@``, which URL redaction cut at."""
    monkeypatch.delenv("OPENAI_API_KEY")
    vllm_key = "vllm-key-0123456789abcdef"
    monkeypatch.setenv("VLLM_API_KEY", vllm_key)
    password = "p@ss-w0rd-x"
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    answer = grounded_responder(gold)
    failing = next(iter(gold))

    def echoing(request):
        if request.inputs.get("question") == failing:
            raise RuntimeError(
                f"upstream refused key={vllm_key} (Authorization: Basic {basic}; token {basic}; "
                f"password {password})"
            )
        return answer(request)

    out, page = tmp_path / "run", tmp_path / "report.html"
    with LocalOpenAIServer(echoing) as server:
        base = server.api_base.replace("http://", f"http://alice:{password}@")
        argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--limit", "3", "--no-progress"]
        argv += ["--out", str(out), "--html", str(page), "--mlflow", tracking_uri]
        argv += ["--retries", "0", "--no-cache"]
        code = main([*argv, "--lm", "openai/scripted", "--api-base", base])
        assert set(server.authorizations) == {f"Basic {basic}"}
    printed = capsys.readouterr()
    assert code == 1, printed.err  # one example failed, and was recorded
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    errors = [r["error"]["message"] for r in records if r.get("error")]
    assert len(errors) == 1 and "key=***" in errors[0] and "Basic ***" in errors[0], errors
    client, runs = _runs(tracking_uri)
    events = [e for t in _traces(client, runs[0]) for s in t.data.spans for e in s.events]
    messages = [e.attributes["exception.message"] for e in events if e.name == "exception"]
    assert messages and all("key=***" in m for m in messages), messages  # the cause is kept, redacted
    secrets = (vllm_key, basic, password, "w0rd-x")
    for secret in secrets:
        assert secret not in printed.out + printed.err, secret
        assert secret not in page.read_text(), secret
        for path in out.iterdir():
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), (path.name, secret)
    files = [tmp_path / "mlflow.db", *(tmp_path / "mlruns").rglob("*")]
    for path in files:
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, (path, secret)
