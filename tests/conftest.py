"""Hermetic test settings: no network, no shared caches. Environment is set before DSPy is imported.

Below the settings, the fixtures that tests in more than one folder share: the repository's root, benchmark
scripts as modules, a tiny dense encoder, a stand-in vLLM, the reply schema a schema-holding LM is sent,
``ragsuite eval`` command lines against a local server, ``ragsuite compile`` command lines on a tiny dataset,
and a headless browser. A folder's own helpers are fixtures of its ``conftest.py``; no test module imports
another module of ``tests/`` (``tests/test_test_layout.py``).
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

_TMP = Path(tempfile.mkdtemp(prefix="ragsuite-tests-"))
# litellm otherwise tries to download its model-cost map and stalls offline.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
# DSPy reads DSPY_CACHEDIR at import time; keep its disk cache out of the home directory.
os.environ["DSPY_CACHEDIR"] = str(_TMP / "dspy_cache")
# A llama-server built by `ragsuite serve --local --build` (the real-LM tests' fast engine) lives in the
# user's cache, which the tests replace by a temporary one: name it before that happens.
if not os.environ.get("RAGSUITE_LLAMA_SERVER"):
    from ragsuite.local_lm.build import built_llama_server  # imports neither dspy nor torch

    _built = built_llama_server()
    if _built is not None:
        os.environ["RAGSUITE_LLAMA_SERVER"] = str(_built)
os.environ.setdefault("RAGSUITE_CACHE", str(_TMP / "ragsuite_cache"))
# The committed fixtures (a slice of every dataset, cut by tests/fixtures/make_fixtures.py): a fresh clone has
# no other data, so no test may depend on any.
#: The repository's root: pyproject.toml, README.md, docs/, benchmarks/, examples/ and tests/ are under it.
ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DATA = ROOT / "tests" / "fixtures" / "data"
os.environ["RAGSUITE_DATA"] = str(FIXTURE_DATA)
# colbert-ai compiles C++ extensions on first use; one cache per virtual environment.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# A suite started in the background by a non-interactive shell (`pytest &`) inherits SIGINT ignored, and so
# would every process a test starts and then interrupts with Ctrl-C: a handler here gives them back the
# default (a handler does not survive exec; an ignored signal does).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_KEYS = ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL", "RAGSUITE_LOCAL_API_KEY", "LLAMA_API_KEY")
for key in _KEYS:
    os.environ.pop(key, None)

import dspy  # noqa: E402
import pytest  # noqa: E402

if TYPE_CHECKING:
    from ragsuite.testing.openai_server import LocalOpenAIServer
    from ragsuite.testing.scripted import ScriptedRequest

dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The committed fixture datasets (tests/fixtures/data)."""
    return FIXTURE_DATA


@pytest.fixture(autouse=True)
def _own_redaction_registry(monkeypatch):
    """Each test starts with no registered secrets: the registry is process-wide, and a secret another test
    (or a docstring example) registered would otherwise decide what this one sees redacted."""
    from ragsuite import redaction

    monkeypatch.setattr(redaction, "_REGISTERED", set())


# ------------------------------------------------------------------------------------- the repository
@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository's root (the folder of pyproject.toml): docs/, benchmarks/, examples/, README.md."""
    return ROOT


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark(name)``: ``benchmarks/<name>.py`` as a module (the folder is not a package), for tests
    of a script's parts. Each call runs the script's module code afresh."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
        spec.loader.exec_module(module)
        return module

    return load


# ------------------------------------------------------------------------------- a tiny dense encoder
_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="session")
def tiny_encoder() -> Callable[..., Path]:
    """``tiny_encoder(texts, out, vocab_size=N)``: a tiny random BERT sentence encoder over ``texts``' words,
    saved in ``out`` and returned, for dense tests without model weights.

    The builder writes a WordPiece vocabulary of ``texts`` and a 1-layer, 32-wide random BERT, the same in
    every process; it skips the test (naming the dense extra) when transformers or torch is missing. The
    vocabulary is not trained with ``tokenizers``: its trainer breaks ties in Rust hash-map order, seeded anew
    per process, so the token ids (and now and then the tokens) would change from run to run, and the
    embeddings with them. Here: the special tokens, every character alone and as a ``##`` continuation, then
    the most frequent words (ties alphabetical) up to ``vocab_size``.
    """
    from ragsuite.errors import install_hint

    def build(texts: Iterable[str], out: Path, *, vocab_size: int) -> Path:
        reason = "needs the dense extra: " + install_hint("dense")
        transformers = pytest.importorskip("transformers", reason=reason)
        torch = pytest.importorskip("torch", reason=reason)
        from tokenizers.normalizers import BertNormalizer
        from tokenizers.pre_tokenizers import BertPreTokenizer

        normalizer, pre_tokenizer = BertNormalizer(lowercase=True), BertPreTokenizer()
        counts = Counter(
            word
            for text in texts
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
        )
        chars = sorted({c for word in counts for c in word})
        vocab = [*_SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars)]
        words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
        vocab += words[: max(0, vocab_size - len(vocab))]
        (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        transformers.BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(str(out))
        torch.manual_seed(0)
        config = transformers.BertConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
        transformers.BertModel(config).save_pretrained(str(out))
        return out

    return build


# ---------------------------------------------------------------------------------- a stand-in vLLM
_FAKE_VLLM = textwrap.dedent(
    """\
    #!{python}
    import json, os, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    if {fail}:
        print("fake vllm: CUDA not available", file=sys.stderr)
        sys.exit(3)
    assert args[0] == "serve", args
    port = int(args[args.index("--port") + 1])
    if port == {fail_port}:
        sys.exit(5)
    name = args[args.index("--served-model-name") + 1] if "--served-model-name" in args else args[1]
    env = os.environ
    record = {{"args": args, "key": env.get("VLLM_API_KEY"), "gpus": env.get("CUDA_VISIBLE_DEVICES")}}
    with open(os.path.join({logs!r}, f"{{port}}.json"), "w") as f:
        json.dump(record, f)
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            body = json.dumps({{"data": [{{"id": name}}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture(scope="session")
def fake_vllm() -> Callable[..., tuple[Path, Path]]:
    """``fake_vllm(folder, fail=False, fail_port=0)``: a stand-in ``vllm`` executable for the tests of
    ``ragsuite serve``, written as ``folder/vllm``; returns it and the folder of its records.

    It takes ``vllm serve MODEL --port PORT ...``, records what it was started with in ``logs/PORT.json``
    (``args``, ``key``: its ``$VLLM_API_KEY``, ``gpus``: its ``$CUDA_VISIBLE_DEVICES``) and serves
    ``/v1/models`` (``--served-model-name``, else MODEL) on 127.0.0.1, whatever ``--host`` says, until SIGINT
    or SIGTERM, on which it exits 0. ``fail``: it exits 3 at once with a CUDA error, as vLLM on a machine
    without a GPU does. ``fail_port``: it exits 5 at once when asked to serve on this port (one failing
    replica).
    """

    def write(folder: Path, *, fail: bool = False, fail_port: int = 0) -> tuple[Path, Path]:
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        script = folder / "vllm"
        script.write_text(
            _FAKE_VLLM.format(python=sys.executable, fail=fail, fail_port=fail_port, logs=str(logs))
        )
        script.chmod(0o755)
        return script, logs

    return write


# ------------------------------------------------------------------- `ragsuite eval` against a local server
_OUTPUT_FIELD = re.compile(r"^\d+\. `(\w+)` \((.*)\):", re.MULTILINE)


@pytest.fixture(scope="session")
def universal_responder() -> Callable[[dict[str, str]], Callable[[ScriptedRequest], dict]]:
    """``universal_responder(gold)``: a responder that answers any stage of any program with a well-typed
    value; the answer stage gets the gold answer of the question (``gold``: question -> answer)."""

    def make(gold: dict[str, str]) -> Callable[[ScriptedRequest], dict]:
        def respond(request: ScriptedRequest) -> dict:
            section = request.system.split("Your output fields are:", 1)[-1]
            types = dict(_OUTPUT_FIELD.findall(section))
            values: dict = {}
            for name in request.output_fields:
                kind = types.get(name, "str")
                if kind.startswith("Literal["):
                    values[name] = re.findall(r"'([^']*)'", kind)[-1]
                elif kind == "bool":
                    values[name] = "True"
                elif kind == "list[int]":
                    values[name] = [1, 2]
                elif kind.startswith("list"):
                    values[name] = ["what is it about"]
                elif kind in ("int", "float"):
                    values[name] = "1"
                elif name == "answer":
                    values[name] = gold.get(request.inputs.get("question", ""), "an answer")
                else:
                    values[name] = "a note about the question"
            return values

        return respond

    return make


@pytest.fixture(scope="session")
def eval_args() -> Callable[..., list[str]]:
    """``eval_args(server, out, *extra, program="vanilla", dataset="hotpotqa", program_file=None)``: the
    argument list of a ``ragsuite eval`` run against the local ``server``, without cache or progress bar,
    writing to ``out``; of the program file ``program_file`` when one is given, else of ``program``."""

    def args(
        server: LocalOpenAIServer,
        out: Path,
        *extra: str,
        program: str = "vanilla",
        dataset: str = "hotpotqa",
        program_file: Path | None = None,
    ) -> list:
        return [
            "eval",
            *(["--program-file", str(program_file)] if program_file else ["--program", program]),
            "--dataset",
            dataset,
            "--lm",
            "openai/scripted",
            "--api-base",
            server.api_base,
            "--no-cache",
            "--no-progress",
            "--out",
            str(out),
            *extra,
        ]

    return args


@pytest.fixture(scope="session")
def reply_schema() -> Callable[[Any], dict[str, Any]]:
    """``reply_schema(signature)``: the JSON schema :class:`~ragsuite.signatures.compact.CompactJSONAdapter`
    sends as ``response_format`` to an LM that holds replies to a schema (as llama-server does)."""
    import dspy

    from ragsuite.signatures.compact import CompactJSONAdapter

    class SchemaLM(dspy.LM):
        supported_params = {"response_format"}  # noqa: RUF012
        supports_response_schema = True

    def schema(signature: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        CompactJSONAdapter()._prepare_response_format(SchemaLM("openai/m"), kwargs, signature)
        return kwargs["response_format"].model_json_schema()

    return schema


@pytest.fixture(scope="session")
def stage_reply_bounds(reply_schema) -> Callable[[Any], dict[str, dict[str, Any]]]:
    """``stage_reply_bounds(program)``: per stage predictor, the bounds (``maxLength``, ``maxItems`` and the
    items' ``maxLength``) of each output field :func:`reply_schema` sends for it; unbounded fields are left
    out."""

    def limits(spec: dict[str, Any]) -> dict[str, Any]:
        found = {key: spec[key] for key in ("maxLength", "maxItems") if key in spec}
        if "maxLength" in spec.get("items", {}):
            found["items"] = {"maxLength": spec["items"]["maxLength"]}
        return found

    def bounds(program: Any) -> dict[str, dict[str, Any]]:
        return {
            stage: {
                field: limits(spec)
                for field, spec in reply_schema(predictor.signature)["properties"].items()
                if limits(spec)
            }
            for stage, predictor in program.named_predictors()
        }

    return bounds


@pytest.fixture(scope="session")
def run_eval() -> Callable[[LocalOpenAIServer, Path, str], Path]:
    """``run_eval(server, out, program)``: ``ragsuite eval`` of ``program`` on 4 HotpotQA questions against
    the local ``server``, written to ``out`` (returned); fails the test when the run fails."""
    from ragsuite.cli import main

    def run(server: LocalOpenAIServer, out: Path, program: str) -> Path:
        argv = ["eval", "--program", program, "--dataset", "hotpotqa", "--limit", "4", "--no-cache"]
        argv += ["--no-progress", "--lm", "openai/scripted", "--api-base", server.api_base, "--out", str(out)]
        assert main(argv) == 0
        return out

    return run


# ------------------------------------------------------------ `ragsuite compile` on a tiny yes/no dataset
@pytest.fixture(scope="session")
def tiny_dataset() -> Callable[..., Path]:
    """``tiny_dataset(root, n=6)``: the data directory ``root`` (returned), holding a hotpotqa dev split of
    ``n`` questions "Is tiny <i> answered no?", each answered "no", and no corpus (nothing to retrieve)."""

    def write(root: Path, n: int = 6) -> Path:
        folder = root / "hotpotqa"
        folder.mkdir(parents=True)
        rows = [
            {"id": f"t{i}", "question": f"Is tiny {i} answered no?", "answers": ["no"], "type": "comparison"}
            for i in range(n)
        ]
        (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return root

    return write


@pytest.fixture(scope="session")
def answers_no() -> Callable[[ScriptedRequest], dict | str]:
    """A responder for ``tiny_dataset``'s questions: "no" for an answer, "Scripted <field>" for any other
    output field (GEPA's proposed instructions included), as a JSON object where the prompt asks for one."""

    def respond(request: ScriptedRequest) -> dict | str:
        values = {name: ("no" if name == "answer" else f"Scripted {name}") for name in request.output_fields}
        if "Respond with a JSON object" in request.user:
            return json.dumps(values)
        return values

    return respond


@pytest.fixture(scope="session")
def compile_args() -> Callable[..., list[str]]:
    """``compile_args(data, out, *extra, optimizer="bootstrap", val=3, server=None)``: the argument list of a
    ``ragsuite compile`` of the no-retrieval program on the hotpotqa dev split of ``data`` (a
    ``tiny_dataset``), 2 train and ``val`` val questions, one thread, writing to ``out``; with a local
    ``server``, against it as ``openai/scripted``, without cache or retries."""

    def args(
        data: Path,
        out: Path,
        *extra: str,
        optimizer: str = "bootstrap",
        val: int = 3,
        server: LocalOpenAIServer | None = None,
    ) -> list[str]:
        lm = ["--lm", "openai/scripted", "--api-base", server.api_base] if server else []
        lm += ["--no-cache", "--retries", "0"] if server else []
        return [
            "compile",
            "--program",
            "no-retrieval",
            "--dataset",
            "hotpotqa",
            "--data-dir",
            str(data),
            "--retriever",
            "none",
            "--optimizer",
            optimizer,
            "--train",
            "2",
            "--val",
            str(val),
            "--threads",
            "1",
            "--out",
            str(out),
            *lm,
            *extra,
        ]

    return args


# -------------------------------------------------------------------------------- a headless browser
_BROWSER = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]

# Appended to a copy of a report: once the page has rendered, writes what overflows into <pre id=measure>:
# the page's width against the window's, elements reaching past the window's right edge, SVG texts outside
# their drawing, and where the run selector ends.
_MEASURE = """<script>
window.addEventListener('load', () => {
  const de = document.documentElement, width = de.clientWidth, out = {width, scroll: de.scrollWidth};
  const visible = e => { const r = e.getBoundingClientRect(); return r.width > 0 || r.height > 0; };
  out.overflowing = [...document.body.querySelectorAll('*')].filter(visible)
    .filter(e => e.getBoundingClientRect().right > width + 0.5)
    .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' + (e.textContent || '').slice(0, 40));
  out.clipped = [];
  out.texts = 0;
  document.querySelectorAll('svg').forEach(svg => {
    const box = svg.getBoundingClientRect();
    svg.querySelectorAll('text').forEach(t => {
      out.texts++;
      const r = t.getBoundingClientRect();
      const outside = r.left < box.left - 0.5 || r.right > box.right + 0.5;
      if (outside || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) out.clipped.push(t.textContent);
    });
  });
  const run = document.getElementById('run');
  out.run = run ? run.getBoundingClientRect().right : 0;
  out.labels = [...document.querySelectorAll('#run option')].map(o => o.textContent);
  const pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="session")
def chromium() -> str | None:
    """The headless browser's executable (chromium), or None on a machine without one."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _dump_dom(chromium: str, page: Path, *options: str) -> str:
    """The DOM of ``page`` once its script ran, from headless Chromium started with ``options``."""
    from ragsuite.processes import stop_process

    process = subprocess.Popen(
        [chromium, *_BROWSER, *options, "--dump-dom", page.as_uri()],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        dom, _ = process.communicate(timeout=90)
    finally:
        stop_process(process)
    return dom


@pytest.fixture(scope="session")
def browser_dom(chromium: str | None) -> Callable[[Path, Path], str]:
    """``browser_dom(page, screenshot)``: the DOM after the page's script ran, and a screenshot, from headless
    Chromium. A test that asks for it is skipped on a machine without the browser."""
    from ragsuite.processes import stop_process

    if chromium is None:
        pytest.skip("needs a browser: apt-get install chromium")

    def dom_of(page: Path, screenshot: Path) -> str:
        dom = _dump_dom(chromium, page)
        shot = subprocess.Popen(
            [chromium, *_BROWSER, f"--screenshot={screenshot}", "--window-size=1200,1600", page.as_uri()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            shot.wait(timeout=90)
        finally:
            stop_process(shot)
        return dom

    return dom_of


@pytest.fixture(scope="session")
def layout_at(chromium: str | None) -> Callable[[Path, int], dict]:
    """``layout_at(page, width)``: what overflows when ``page`` is shown in a ``width``-px wide window of
    headless Chromium. A test that asks for it is skipped on a machine without the browser."""
    if chromium is None:
        pytest.skip("needs a browser: apt-get install chromium")

    def measure(page: Path, width: int) -> dict:
        probe = page.with_name(page.stem + "-measured.html")
        probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
        dom = _dump_dom(chromium, probe, f"--window-size={width},900")
        found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
        assert found, "the page did not finish rendering"
        return json.loads(html.unescape(found.group(1)))

    return measure
