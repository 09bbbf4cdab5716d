"""Programs compiled on the local LM, scored on held-out questions side by side with the uncompiled program
and with compiled vanilla.

1. **Compile.** ``ragsuite compile`` of ``--program`` (DeepNote by default) and of vanilla on ``--dataset``'s
   dev split (its ``--train`` and ``--val`` slices, the same for both), as a user runs it, against one local
   server with one slot and every core (DSPy's BootstrapFewShot runs one question at a time). The program
   file goes to ``OUT/programs/<program>-<dataset>-<optimizer>.json``; a stopped compile resumes from its LM
   cache beside it. ``--compiled FILE`` scores a file compiled before (e.g. a shipped one) instead.
2. **Score.** The arms (:func:`arms_of` ``--program``: its compiled file, the same file without its demos,
   compiled vanilla, and, once ``--tuned FILE`` names one, the compiled program with the knobs ``ragsuite
   tune --program-file`` chose, and, with ``--larger-lm MODEL``, the uncompiled program on that larger LM,
   on a server of its own; ``--arms`` keeps some of them) answer the same held-out questions (dev questions
   outside both slices) of each ``--eval DATASET:N``, in alternating chunks of ``--chunk`` questions so that
   every arm sees the same machine. Each finished chunk's records are appended to
   ``OUT/<dataset>.<arm>.records.jsonl.gz`` and its wall time to ``OUT/chunks.jsonl``; a chunk stopped
   mid-way runs again whole (its run directory under ``OUT/work/`` is cleared), so that its wall time covers
   every question it records. Rerun the same command to go on.
Both steps run on one local server with ragsuite's default settings, as ``--lm local`` starts it (the larger
LM on one more, started the same way; only one of them is working at a time).

3. **Report** (``--report``): from the records alone, per dataset, each arm's score with its 95% bootstrap
   interval, EM and F1, failures, tokens in/out and seconds per question over the questions every arm
   answered, then the compiled program against each other arm question by question (paired bootstrap
   interval and sign-flip p-value). ``--docs`` writes it into ``docs/local-lm.md``, between the
   ``--markers`` pair (``compiled-local``: DeepNote's run; ``compiled-local-blendfilter``: BlendFilter's;
   ``compiled-local-vs-1.5b``: the compiled DeepNote against the uncompiled one on the 1.5B model).

A dataset other than ``--dataset`` runs the same program files: a transfer of the compiled demos.

4. **Tune** (``ragsuite tune --program-file``, run on its own): the compiled program's knobs searched with
   Optuna on the compile's val slice, its demos kept. ``--report --tune DIR`` renders every trial of the
   tune's output folder ``DIR`` from its ``trials.json``; ``--docs`` writes it between the
   ``tune-compiled-local`` markers.

Example:
    python benchmarks/compiled_local.py --data-dir DATA --dataset hotpotqa --train 30 --val 10 \\
        --eval hotpotqa:100 2wikimultihopqa:50 --out benchmarks/results/compiled-local
    python benchmarks/compiled_local.py --out benchmarks/results/compiled-local --report \\
        --tune benchmarks/results/tune-compiled-local --docs docs/local-lm.md
    python benchmarks/compiled_local.py --data-dir DATA --dataset hotpotqa --eval hotpotqa:100 \\
        --compiled examples/compiled/deepnote-hotpotqa-local.json --arms compiled larger \\
        --larger-lm local:qwen2.5-coder-1.5b-instruct-q4_k_m --out benchmarks/results/compiled-local-vs-1.5b
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from real_lm import append_jsonl, read_jsonl, write_between_markers  # noqa: E402

#: How the larger LM's arm is labelled after its program (the report finds that arm by it).
LARGER_ARM = "on the larger LM"


def arms_of(program: str, *, larger: bool = False) -> tuple[tuple[str, str, str], ...]:
    """The arms of ``--program``, each (label, program, kind): ``compiled`` is the compile's program file,
    ``no-demos`` the same file without its demos (the uncompiled program), ``tuned`` the compiled file with
    the knobs a tune chose (``--tuned``), and compiled vanilla; with ``larger`` (``--larger-lm``), also the
    uncompiled program on the larger LM. The first arm is the one the others are compared with. An arm whose
    file is not there (no tune yet) is left out: a later arm joins by answering the chunks the others
    finished."""
    arms = (
        (f"{program} compiled", program, "compiled"),
        (program, program, "no-demos"),
        ("vanilla compiled", "vanilla", "compiled"),
        (f"{program} tuned", program, "tuned"),
    )
    return (*arms, (f"{program} {LARGER_ARM}", program, "larger")) if larger else arms


#: How each kind of arm's program file is named after the compiled one (the larger LM runs the uncompiled
#: program).
FILE_SUFFIX = {"compiled": "", "no-demos": "-no-demos", "tuned": "-tuned", "larger": "-no-demos"}
#: ``--arms`` names an arm by its kind, vanilla's by its program.
ARM_NAMES = ("compiled", "no-demos", "vanilla", "tuned", "larger")
#: The command of the committed run, named in its report.
COMMAND = (
    "python benchmarks/compiled_local.py --data-dir DATA --dataset hotpotqa --train 30 --val 10 "
    "--max-demos 2 --teacher-lm local:qwen2.5-coder-1.5b-instruct-q4_k_m --teacher-threads 2 "
    "--eval hotpotqa:100 2wikimultihopqa:50 --chunk 4 "
    "--tuned benchmarks/results/tune-compiled-local/deepnote-hotpotqa-quality+tokens/best.json "
    "--out benchmarks/results/compiled-local"
)
SMOKE_BELOW = 30


def program_file(out: Path, program: str, args: argparse.Namespace, kind: str = "compiled") -> Path:
    return out / "programs" / f"{program}-{args.dataset}-{args.optimizer}{FILE_SUFFIX[kind]}.json"


def arm_name(arm: tuple[str, str, str]) -> str:
    """The arm's name in ``--arms``: its kind, or ``vanilla`` for compiled vanilla."""
    _, program, kind = arm
    return "vanilla" if program == "vanilla" else kind


def chosen_arms(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The arms ``--arms`` keeps (every arm without it), the larger LM's only with ``--larger-lm``."""
    wanted = getattr(args, "arms", None) or ARM_NAMES
    larger = getattr(args, "larger_lm", None) is not None
    return [arm for arm in arms_of(args.program, larger=larger) if arm_name(arm) in wanted]


def present_arms(out: Path, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The chosen arms whose program file is there."""
    return [arm for arm in chosen_arms(args) if program_file(out, arm[1], args, arm[2]).exists()]


def compile_programs(args: argparse.Namespace, out: Path, server: Any) -> None:
    """Step 1: compile each program not yet compiled (a stopped compile resumes from its LM cache)."""
    from ragsuite.cli import main as cli

    # Every chosen arm needs its program's compiled file: the uncompiled arms strip its demos.
    needed = dict.fromkeys(program for _, program, _ in chosen_arms(args))
    for program in needed:
        target = program_file(out, program, args)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        code = cli([
            "compile", "--program", program, "--dataset", args.dataset, "--data-dir", str(args.data_dir),
            "--optimizer", args.optimizer, "--train", str(args.train), "--val", str(args.val), "--no-eval",
            "--lm", args.model, "--api-base", server.api_base, "--threads", str(server.settings.parallel),
            "--no-progress", "--out", str(target), "--option", f"max_bootstrapped_demos={args.max_demos}",
            *(["--teacher-lm", args.teacher_lm] if args.teacher_lm else []),
            *(["--local-threads", str(args.teacher_threads)] if args.teacher_threads else []),
        ])  # fmt: skip
        if code:
            raise SystemExit(f"compile of {program} failed (exit {code}); rerun to resume it")
        seconds = time.perf_counter() - started
        append_jsonl(out / "compiles.jsonl", [{"program": program, "seconds": seconds}])
        print(f"# compiled {program} in {seconds:.0f} s: {target}", flush=True)
    # A program without its demos: the uncompiled program, with the same held-out questions.
    for _, program, kind in chosen_arms(args):
        bare = program_file(out, program, args, "no-demos")
        if FILE_SUFFIX[kind] == "-no-demos" and not bare.exists():
            document = json.loads(program_file(out, program, args).read_text())
            for state in document["predictors"].values():
                state["demos"] = []
            bare.write_text(json.dumps(document, indent=1))


def keep_given_files(args: argparse.Namespace, out: Path) -> None:
    """Keep ``--tuned`` (and ``--compiled``) beside the compiled files (the records then name a file of the
    run folder); refused when the arm already holds another file."""
    for kind, given in (("compiled", getattr(args, "compiled", None)), ("tuned", args.tuned)):
        if given is None:
            continue
        kept = program_file(out, args.program, args, kind)
        if kept.exists() and kept.read_bytes() != given.read_bytes():
            raise SystemExit(f"{kept} holds another {kind} program than {given}: use another --out")
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(given, kept)


def held_out(args: argparse.Namespace, out: Path, dataset: str, limit: int) -> tuple[dict[str, Any], list]:
    """Each arm's loaded program and the held-out questions of ``dataset`` they share (refused when the arms'
    compile slices differ)."""
    from ragsuite.cli.args import exclude_holdout
    from ragsuite.data.datasets import load_dataset
    from ragsuite.programs.program_file import load_for_data

    examples = load_dataset(dataset, split="dev")
    programs, kept = {}, None
    for label, program, kind in present_arms(out, args):
        loaded = load_for_data(program_file(out, program, args, kind), dataset=dataset, program=program)
        programs[label] = loaded.program
        mine, _ = exclude_holdout(loaded.program, examples, allow_overlap=False)
        mine = mine[:limit]
        if kept is not None and ids(mine) != ids(kept):
            raise SystemExit(
                f"the arms hold out different {dataset} questions: compile them with the same slices"
            )
        kept = mine
    return programs, kept or []


def ids(examples: list) -> list[str]:
    from ragsuite.evaluation import example_id

    return [example_id(ex, i) for i, ex in enumerate(examples)]


def score_chunks(args: argparse.Namespace, out: Path, server: Any, larger: Any = None) -> None:
    """Step 2: every arm on each chunk of held-out questions not yet scored, arms alternating; the larger LM's
    arm on the ``larger`` server."""
    import dspy
    from real_lm import generation

    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm

    done = {(row["dataset"], row["arm"], row["chunk"]) for row in read_jsonl(out / "chunks.jsonl")}
    arms = present_arms(out, args)
    served = {label: (args.larger_lm, larger) if kind == "larger" else (args.model, server)
              for label, _, kind in arms}  # fmt: skip
    lms = {
        label: build_lm(served[label][0], api_base=served[label][1].api_base, cache=False,
                        **generation(program))
        for label, program, _ in arms
    }  # fmt: skip
    for target in args.eval:
        dataset, limit = target.split(":")
        programs, examples = held_out(args, out, dataset, int(limit))
        for start in range(0, len(examples), args.chunk):
            chunk = examples[start : start + args.chunk]
            for label, _, _ in arms:
                if (dataset, label, start) in done:
                    continue
                work = out / "work" / dataset / label.replace(" ", "-") / f"chunk-{start:04d}"
                # A resumed chunk would time only its last questions, and seconds per question come from
                # chunk wall times: a stopped chunk runs again whole.
                shutil.rmtree(work, ignore_errors=True)
                started = time.perf_counter()
                model, its_server = served[label]
                with dspy.context(lm=lms[label]):
                    result = evaluate(
                        programs[label], chunk, dataset=dataset, threads=its_server.settings.parallel,
                        out_dir=work, progress=False,
                    )  # fmt: skip
                wall = time.perf_counter() - started
                append_records(records_path(out, dataset, label), result.records)
                append_jsonl(out / "chunks.jsonl", [{
                    "dataset": dataset, "arm": label, "chunk": start, "questions": len(chunk), "wall": wall,
                    "model": model, "server": its_server.settings.public(),
                }])  # fmt: skip
                print(f"# {dataset} {label}: questions {start + 1}-{start + len(chunk)} in {wall:.0f} s",
                      flush=True)  # fmt: skip


def records_path(out: Path, dataset: str, label: str) -> Path:
    return out / f"{dataset}.{label.replace(' ', '-')}.records.jsonl.gz"


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Append records as one more gzip member (a reader sees one stream); a record already there (the chunk
    was stopped after its records landed) is not written again."""
    have = {r["id"] for r in read_records(path)}
    fresh = [r for r in records if r["id"] not in have]
    if fresh:
        with gzip.open(path, "at", encoding="utf-8") as sink:
            sink.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in fresh)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl.gz`` file (every gzip member), none when it does not exist."""
    return read_jsonl(path.with_suffix(""))


def report(out: Path, *, command: str | None = None) -> str:
    """The Markdown report of a run folder, from its records alone (see the module docstring); the command
    is the one the folder's ``command.txt`` holds, else :data:`COMMAND`."""
    from ragsuite.data.datasets import get_dataset_info

    if command is None:
        saved = out / "command.txt"
        command = saved.read_text(encoding="utf-8").strip() if saved.exists() else COMMAND
    chunks = read_jsonl(out / "chunks.jsonl")
    lines = [f"Command: `{command}`.", ""]
    demos = demos_per_stage(out)
    if demos:
        lines += ["Demos the compile kept, per stage: " + "; ".join(demos) + ".", ""]
    tuned = tuned_knobs(out)
    if tuned:
        lines += [
            "The tuned arm is the compiled file with the knobs a tune chose: " + "; ".join(tuned) + ".",
            "",
        ]
    larger = dict.fromkeys(c["model"] for c in chunks if c["arm"].endswith(f" {LARGER_ARM}"))
    if larger:
        lines += [
            "The arm on the larger LM is the uncompiled program (no demos) on "
            + ", ".join(f"`{model}`" for model in larger)
            + ", served with ragsuite's default settings as `--lm` starts it.",
            "",
        ]
    for dataset in dict.fromkeys(c["dataset"] for c in chunks):
        # The arms in the order they first ran: the compiled program first, a tuned arm after the others.
        labels = list(dict.fromkeys(c["arm"] for c in chunks))
        # Side by side: the chunks every arm finished, and the questions every arm answered in them.
        starts = set.intersection(*({c["chunk"] for c in chunks if c["dataset"] == dataset and c["arm"] == a}
                                    for a in labels))  # fmt: skip
        records = {a: {r["id"]: r for r in read_records(records_path(out, dataset, a))} for a in labels}
        ids = sorted(set.intersection(*(set(rows) for rows in records.values())))
        if not starts or not ids:
            continue
        metric = get_dataset_info(dataset).primary_metric
        names = list(dict.fromkeys([metric, "exact_match", "f1"]))
        n = len(ids)
        smoke = (
            f" (a smoke run: fewer than {SMOKE_BELOW} questions decide nothing)" if n < SMOKE_BELOW else ""
        )
        lines += [
            f"**{dataset}**, {n} held-out dev questions{smoke}:",
            "",
            "| program | "
            + " | ".join(f"{name} [95% CI]" if name == metric else name for name in names)
            + " | failed | tokens in/out per question | s/question |",
            "|---" * (len(names) + 4) + "|",
        ]
        scores = {label: question_scores([records[label][i] for i in ids], names) for label in labels}
        for label in labels:
            mine = [
                c for c in chunks if c["dataset"] == dataset and c["arm"] == label and c["chunk"] in starts
            ]
            cells = arm_cells(scores[label], [records[label][i] for i in ids], mine, names)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| compared question by question | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        first = labels[0]
        for other in labels[1:]:
            cells = [paired_cell(scores[first][name], scores[other][name]) for name in names]
            lines.append(f"| {first} − {other} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def tune_report(folder: Path) -> str:
    """Every trial of the ``ragsuite tune`` output ``folder`` (each study folder's ``trials.json``) as one
    Markdown table: its knobs, validation scores, tokens, LM calls and wall time, the Pareto front and the
    written trial marked; the command is ``folder/command.txt``'s."""
    saved = folder / "command.txt"
    lines = [f"Command: `{saved.read_text(encoding='utf-8').strip()}`." if saved.exists() else "", ""]
    for trials_file in sorted(folder.glob("*/trials.json")):
        lines += [*study_table(trials_file.parent), ""]
    return "\n".join(lines).strip()


def study_table(study: Path) -> list[str]:
    """One tune study's folder (``trials.json``, ``best.json``, ``pareto.json``) as a Markdown table."""
    from ragsuite.data.datasets import get_dataset_info

    trials = [t for t in json.loads((study / "trials.json").read_text()) if t["state"] == "COMPLETE"]
    tuning = json.loads((study / "best.json").read_text())["metadata"]["tuning"]
    pareto = study / "pareto.json"
    front = {t["number"] for t in json.loads(pareto.read_text())["front"]} if pareto.exists() else set()
    names = list(dict.fromkeys(["f1", get_dataset_info(tuning["dataset"]).primary_metric, "exact_match"]))
    knobs = list(dict.fromkeys(k for t in trials for k in t["knobs"]))
    n = tuning["valset_size"]
    smoke = f" (a smoke run: fewer than {SMOKE_BELOW} questions decide nothing)" if n < SMOKE_BELOW else ""
    lines = [
        f"Study `{tuning['study']}`: {len(trials)} complete trials, each on the same {n} validation "
        f"questions{smoke}; quality is {tuning['quality_metric']}. Written: trial {tuning['trial']}. "
        "`*`: on the Pareto front of quality and tokens. A call a trial shares with an earlier one is "
        "replayed from the tune's LM cache: its tokens count, its time does not.",
        "",
        "| trial | " + " | ".join(knobs) + " | " + " | ".join(names)
        + " | failed | tokens in/out per question | LM calls per question (replayed) | wall s |",
        "|---" * (len(knobs) + len(names) + 5) + "|",
    ]  # fmt: skip
    for t in trials:
        cost = t.get("cost") or {}
        written = " (written)" if t["number"] == tuning["trial"] else ""
        cells = [
            f"{t['number']}{written}{' *' if t['number'] in front else ''}",
            *(str(t["knobs"].get(k, "")) for k in knobs),
        ]
        cells += [f"{100 * t['metrics'][name]:.1f}" for name in names] + [str(t.get("errors"))]
        spent = [cost.get("input_tokens"), cost.get("output_tokens")]
        cells += [f"{spent[0]:,.0f}/{spent[1]:,.0f}" if None not in spent else "–"]
        calls, replayed = cost.get("lm_calls"), cost.get("cache_hits")
        cells += [f"{calls:.1f} ({replayed:.1f})" if None not in (calls, replayed) else "–"]
        cells += [f"{t['seconds']:.0f}" if t.get("seconds") is not None else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def question_scores(rows: list[dict[str, Any]], names: list[str]) -> dict[str, list[float]]:
    """Each metric's score per question; a failed question scores 0, as compile's before/after counts it."""
    return {
        name: [0.0 if r.get("error") else float(r["metrics"].get(name, 0.0)) for r in rows] for name in names
    }


def arm_cells(
    scores: dict[str, list[float]], rows: list[dict[str, Any]], chunks: list[dict[str, Any]], names: list[str]
) -> list[str]:
    """The first metric with its 95% bootstrap interval, the others, failures, tokens and seconds per question
    (the wall time of the arm's chunks over their questions)."""
    from ragsuite.stats import bootstrap_ci

    n = len(rows)
    low, high = bootstrap_ci(scores[names[0]])
    cells = [f"{100 * sum(scores[names[0]]) / n:.1f} [{100 * low:.1f}, {100 * high:.1f}]"]
    cells += [f"{100 * sum(scores[name]) / n:.1f}" for name in names[1:]]
    cells.append(str(sum(1 for r in rows if r.get("error"))))
    counted = [(tokens(r, "input"), tokens(r, "output")) for r in rows]
    # A record without its token counts leaves the cell empty: 0 would read as a measurement.
    if all(None not in pair for pair in counted):
        cells.append(f"{sum(i for i, _ in counted) / n:,.0f}/{sum(o for _, o in counted) / n:,.0f}")
    else:
        cells.append("–")
    cells.append(f"{sum(c['wall'] for c in chunks) / sum(c['questions'] for c in chunks):.1f}")
    return cells


def paired_cell(a: list[float], b: list[float]) -> str:
    from ragsuite.stats import paired_test

    result = paired_test(a, b)
    interval = f"[{100 * result.low:+.1f}, {100 * result.high:+.1f}]"
    return f"{100 * result.difference:+.1f} {interval}, p = {result.p_value:.3f}"


def tokens(record: dict[str, Any], kind: str) -> float | None:
    """The record's ``input`` or ``output`` token count; None when it has none."""
    value = record.get("tokens")
    count = value.get(kind) if isinstance(value, dict) else None
    return float(count) if isinstance(count, int | float) else None


def demos_per_stage(out: Path) -> list[str]:
    """``program: stage n, ...`` for each compiled program file in ``OUT/programs``."""
    described = []
    for path in sorted((out / "programs").glob("*.json")):
        if path.stem.endswith(("-no-demos", "-tuned")):
            continue
        document = json.loads(path.read_text())
        counts = ", ".join(
            f"{name} {len(state.get('demos') or [])}" for name, state in document["predictors"].items()
        )
        teacher = (document.get("metadata") or {}).get("teacher_lm")
        described.append(
            f"{document.get('program', path.stem)} ({counts}{f'; teacher {teacher}' if teacher else ''})"
        )
    return described


def tuned_knobs(out: Path) -> list[str]:
    """``program (knob compiled → tuned, ...)`` for each tuned program file in ``OUT/programs``."""
    described = []
    for path in sorted((out / "programs").glob("*-tuned.json")):
        tuned = json.loads(path.read_text())
        compiled = json.loads(path.with_name(path.name.replace("-tuned.json", ".json")).read_text())["knobs"]
        changed = [f"{k} {compiled.get(k)} → {v}" for k, v in tuned["knobs"].items() if compiled.get(k) != v]
        described.append(f"{tuned['program']} ({', '.join(changed) or 'no knob changed'})")
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="run folder; rerun the same command to resume"
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "tests" / "fixtures" / "data")
    parser.add_argument("--model", default="local", help="local, local:NAME or local:PATH (default local)")
    parser.add_argument("--engine", default="auto", choices=("auto", "llama.cpp", "transformers"))
    parser.add_argument(
        "--program", default="deepnote", help="the program compiled beside vanilla (default deepnote)"
    )
    parser.add_argument("--dataset", default="hotpotqa", help="the dataset compiled on (default hotpotqa)")
    parser.add_argument("--optimizer", default="bootstrap", help="ragsuite compile's --optimizer")
    parser.add_argument(
        "--max-demos", type=int, default=2,
        help="demos bootstrapped per stage (default 2: each DeepNote demo carries its passages and notes)",
    )  # fmt: skip
    parser.add_argument(
        "--teacher-lm",
        help="the LM that bootstraps the demos (ragsuite compile's --teacher-lm; default: --model)",
    )
    parser.add_argument(
        "--teacher-threads", type=int,
        help="CPU threads of a local teacher's server (--local-threads; default ragsuite's). BootstrapFewShot"
        " asks one question at a time, so on an otherwise idle machine every core can generate for it",
    )  # fmt: skip
    parser.add_argument("--train", type=int, default=30, help="compile's train slice (default 30)")
    parser.add_argument("--val", type=int, default=10, help="compile's val slice, also held out (default 10)")
    parser.add_argument(
        "--eval", nargs="+", default=["hotpotqa:100", "2wikimultihopqa:50"],
        help="DATASET:N held-out questions scored, in this order (default hotpotqa:100 2wikimultihopqa:50)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk", type=int, default=4, help="questions per arm before the next arm (default 4)"
    )
    parser.add_argument(
        "--tuned", type=Path, metavar="FILE",
        help="the compiled program tuned by `ragsuite tune --program-file` (its best.json): scored as one "
        "more arm, from the first chunk on",
    )  # fmt: skip
    parser.add_argument(
        "--compiled", type=Path, metavar="FILE",
        help="score this compiled program file instead of compiling one (e.g. the shipped one)",
    )  # fmt: skip
    parser.add_argument(
        "--larger-lm", metavar="MODEL",
        help="also score the uncompiled program on this LM (e.g. local:qwen2.5-coder-1.5b-instruct-q4_k_m), "
        "on its own server: the compiled small model against the uncompiled larger one",
    )  # fmt: skip
    parser.add_argument(
        "--arms", nargs="+", choices=ARM_NAMES, metavar="ARM",
        help=f"score only these arms ({', '.join(ARM_NAMES)}; default: every one whose file is there)",
    )  # fmt: skip
    parser.add_argument("--report", action="store_true", help="print the report of --out and run nothing")
    parser.add_argument(
        "--docs", type=Path, help="with --report: also write it between the --markers of this Markdown file"
    )
    parser.add_argument(
        "--markers", default="compiled-local",
        help="with --docs: the name of the marker pair the report goes between (default compiled-local, "
        "DeepNote's table; compiled-local-blendfilter is BlendFilter's, compiled-local-vs-1.5b the compiled "
        "DeepNote's against the uncompiled one on the 1.5B model)",
    )  # fmt: skip
    parser.add_argument(
        "--tune", type=Path, metavar="DIR",
        help="with --report: also report the trials of this `ragsuite tune --out` folder (and with --docs, "
        "write them between the tune-compiled-local markers)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.arms and "larger" in args.arms and not args.larger_lm:
        parser.error("--arms larger needs --larger-lm MODEL, the LM that arm runs on")
    args.threads = None
    args.max_tokens = None
    if args.report:
        text = report(args.out)
        print(text)
        if args.docs:
            write_between_markers(args.docs, args.markers, text)
        if args.tune:
            tuned = tune_report(args.tune)
            print(tuned)
            if args.docs:
                write_between_markers(args.docs, "tune-compiled-local", tuned)
        return 0
    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "command.txt").exists():
        words = [
            w if w != str(args.data_dir) else "DATA" for w in (argv if argv is not None else sys.argv[1:])
        ]
        (args.out / "command.txt").write_text(
            "python benchmarks/compiled_local.py " + " ".join(words) + "\n", encoding="utf-8"
        )
    from real_lm import start_server

    keep_given_files(args, args.out)
    server = start_server(args, parallel=None, threads=None)
    larger = None
    try:
        compile_programs(args, args.out, server)
        if args.larger_lm and any(kind == "larger" for _, _, kind in present_arms(args.out, args)):
            larger = start_server(argparse.Namespace(**{**vars(args), "model": args.larger_lm}),
                                  parallel=None, threads=None)  # fmt: skip
        score_chunks(args, args.out, server, larger)
    finally:
        server.stop()
        if larger is not None:
            larger.stop()
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
