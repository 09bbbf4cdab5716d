"""Build preference pairs for a program's stages: DeepNote's DNAlign (DeepNote §3.4, Appendices C.1 and D),
and the same construction for other programs' decision stages.

For each sampled training question, every stage is run under nine sampling settings, the grid of the
official data script (``src/gen_dpo_data.py``): temperature in {0.1, 0.5, 0.9} x top_p in {0.1, 0.5, 0.9}.
Each question retrieves with one top-k drawn (seeded) from ``top_ks`` (the paper's 3, 5, 7, "multiple top-k
values to simulate diverse retrieval scenarios"). Every reply counts, those that break the stage's format
included (the official script reads every reply as raw text): judges and labels read a reply's parsed field,
or its raw text when it has none. Pairs, per DeepNote Appendix D and the official script:

1. **note initialization** (D.1): the nine notes written from the question's passages; the judge LM names the
   best and the worst (:mod:`ragsuite.align.judge`). A verdict that names no pair (a tie, a missing or
   out-of-range number, an unparsable reply) gives no pair, and the *last* note is carried forward as the
   best, as the official script's ``LLM_score_init_note`` does; the chain goes on.
2. **query refinement** (D.2): the nine query sets proposed from the best (or carried) initial note; judged,
   and carried forward, the same way.
3. **knowledge accumulation** (D.3): the passages retrieved for the best query set, and the nine updates of
   the note; the program's own NoteCompare stage (run on the judge LM, as the official script does) labels
   each update better (positive) or not (negative; an unparsable verdict is "not better", DeepNote's own
   inference fallback); one of each is drawn at random.
4. **task-oriented generation** (D.4): vanilla RAG's nine answers from the question's passages. For short
   answers, the official script's string rules (``LLM_score_rag``, :func:`official_answer_labels`) joined
   with the task metric: chosen when the answer equals the gold one (or exact match is 1), else, when none
   does, one containing the gold answer and shorter than twice it; rejected when it does not contain the
   gold answer (or the primary metric is 0), else, when none, one longer than twice the gold answer. Yes/no
   and long-form answers are labelled by their metric (the script covers 2WikiMultihopQA only). One of each
   is drawn at random.

The official sampling: the stages generate up to 1,024 tokens (``gen_dpo_data.py``); the judge, which also
runs NoteCompare, is sampled at temperature 1.0, top_p 0.9, up to 1,280 tokens (``utils.call_gpt``). These
are ``ragsuite align build``'s defaults (``--max-tokens``, ``--judge-temperature``, ``--judge-top-p``,
``--judge-max-tokens``).

Differences from the original (what the paper or the official script does; what ragsuite does, and why):

* **top-k**: the script draws ``randint(3, 9)``; ragsuite draws from ``top_ks``, default the paper's 3, 5, 7
  (its Table 9; ``--top-k 3,4,5,6,7,8,9`` gives the script's).
* **the chosen reply parses**: the originals have no reply format. A reply that breaks the stage's DSPy
  format may be rejected, never chosen: such a pair is dropped, and a random draw picks its chosen reply among
  those that parse, so the model is not trained towards replies the program cannot read.
* **JSON-adapter retries**: a reply that only DSPy's JSON-adapter retry parsed keeps the retry's prompt, and
  a pair holds two replies to one prompt: a judged pair whose replies answered different prompts is dropped,
  and a random draw takes its rejected reply among those on the chosen reply's prompt (DPO compares two
  replies under one prompt).
* **empty replies**: the script drops a pair when its randomly drawn reply is empty; ragsuite leaves empty
  replies out of the draw, so no pair is lost by chance.
* **NoteCompare's reference note**: the script compares a batch's updates with the best note of the batch's
  last question (a leftover loop variable); ragsuite uses the question's own note, as the paper says.
* **unparsable NoteCompare**: the script counts a reply as better when "true" appears anywhere in it;
  ragsuite counts it as not better, DeepNote's inference fallback.
* **gold aliases**: the script compares with 2Wiki's single answer; ragsuite applies the string rules to
  every alias of the example.

Every question's pairs are appended to ``records.jsonl`` the moment it finishes, so a build resumes like
``ragsuite eval``; at the end the per-stage counts are drawn (the paper keeps 1,900 / 1,900 / 1,900 / 300 of
15,000 2WikiMultihopQA train questions) and ``train.jsonl`` is written in TRL's preference format.

Beyond the paper, :class:`HANRAGRecipe` builds pairs for HANRAG's decision stages with the dataset's labels
instead of a judge: the router's category against the question type's route (as HANRAG-Oracle maps it), and
the per-passage filter's verdict against the gold passages.

Example:
    >>> from ragsuite.align.builder import SAMPLING_GRID
    >>> len(SAMPLING_GRID), SAMPLING_GRID[0], SAMPLING_GRID[-1]
    (9, (0.1, 0.1), (0.9, 0.9))
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import AdapterParseError

from ragsuite.align.judge import judge_best_worst, judge_instructions
from ragsuite.align.pairs import (
    TRAIN_FILE,
    PreferencePair,
    Sample,
    pair_of,
    select_pairs,
    write_trl,
)
from ragsuite.data.datasets import get_dataset_info
from ragsuite.data.metrics import score_metric
from ragsuite.errors import ConfigError, RagsuiteError
from ragsuite.evaluation import SUMMARY, RunStore, example_id, examples_fingerprint, json_text
from ragsuite.evaluation.example import CallCounter, TokenUsage
from ragsuite.files import atomic_write_text, lock_directory
from ragsuite.lm import LMEndpointError, explain_lm_error, redact
from ragsuite.programs.base import RAGProgram, RunLedger, run_concurrently
from ragsuite.programs.deepnote import retrieval_text
from ragsuite.programs.hanrag_oracle import oracle_route
from ragsuite.programs.pipeline import decision_value
from ragsuite.retrieval.base import query_token_limit
from ragsuite.signatures.answer import answer_signature, format_passages

log = logging.getLogger("ragsuite.align")

#: The official data script's nine sampling settings: (temperature, top_p).
SAMPLING_GRID: tuple[tuple[float, float], ...] = tuple(
    (temperature, top_p) for temperature in (0.1, 0.5, 0.9) for top_p in (0.1, 0.5, 0.9)
)
#: The paper's top-k values (Table 9); one is drawn per question.
TOP_KS: tuple[int, ...] = (3, 5, 7)
#: Manifest keys that define a build: resuming with any of them changed is refused (``counts`` is not one:
#: the selection is drawn again from all the pairs at the end of every run).
BUILD_CONFIG_KEYS = (
    "program",
    "program_file_sha256",
    "knobs",
    "lm",
    "judge_lm",
    "dataset",
    "split",
    "seed",
    "samples",
    "sampling",
    "top_ks",
    "retriever",
    "examples_sha256",
)


# ---------------------------------------------------------------------------- sampling one stage
class _Capture(BaseCallback):
    """Keeps the messages and the reply of every LM call that finished in its context, in order."""

    def __init__(self) -> None:
        self._started: dict[str, Any] = {}
        self.calls: list[tuple[Any, Any]] = []

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._started[call_id] = inputs.get("messages")

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        if exception is None:
            self.calls.append((self._started.pop(call_id, None), outputs))


def _reply_text(outputs: Any) -> str:
    first = outputs[0] if isinstance(outputs, list) and outputs else outputs
    if isinstance(first, dict):
        first = first.get("text", "")
    return "" if first is None else str(first)


def _messages(raw: Any) -> list[dict[str, str]]:
    return [{"role": str(m.get("role")), "content": str(m.get("content") or "")} for m in raw or []]


def sample_stage(
    predictor: Callable[..., Any],
    inputs: Mapping[str, Any],
    settings: Sequence[tuple[float, float]] = SAMPLING_GRID,
    *,
    lm: Any = None,
) -> list[Sample]:
    """Run ``predictor(**inputs)`` once per ``(temperature, top_p)`` setting, concurrently, and keep each
    call's exact chat and raw reply.

    A reply parsed only by DSPy's JSON-adapter retry keeps the retry's chat (the prompt it answered); a
    reply no adapter parses keeps the stage's own chat and its raw reply, with ``error`` set, so that judges
    and labels still read it (the official script reads every reply as raw text).

    Args:
        predictor: A stage predictor (``dspy.Predict`` or any module taking ``config=``).
        inputs: The stage's inputs.
        settings: The sampling settings.
        lm: The LM to use (default: the context's, or the predictor's own).

    Returns:
        One :class:`Sample` per setting, in order; an unparsable reply has ``error`` set.
    """

    def one(setting: tuple[float, float]) -> Sample:
        temperature, top_p = setting
        capture = _Capture()
        overrides: dict[str, Any] = {"callbacks": [*dspy.settings.get("callbacks", []), capture]}
        if lm is not None:
            overrides["lm"] = lm
        sample = Sample(setting=(temperature, top_p))
        try:
            with dspy.context(**overrides):
                prediction = predictor(**inputs, config={"temperature": temperature, "top_p": top_p})
        except AdapterParseError as exc:
            sample.error = "unparsable reply"
            if capture.calls:  # the stage's own prompt and the reply that broke its format
                sample.messages = _messages(capture.calls[0][0])
                sample.completion = _reply_text(capture.calls[0][1])
            else:
                sample.completion = str(exc.lm_response or "")
            return sample
        if not capture.calls:
            sample.error = "no LM call was seen"
            return sample
        # The call whose reply was parsed: the last one (the JSON-adapter retry's, when there was one).
        sample.messages = _messages(capture.calls[-1][0])
        sample.completion = _reply_text(capture.calls[-1][1])
        sample.values = dict(prediction.items())
        if not sample.messages or not sample.completion.strip():
            sample.error = "empty reply"
        return sample

    return run_concurrently(one, list(settings))


def shown_text(sample: Sample, field: str) -> str:
    """What a judge or a label reads of a reply: its parsed ``field`` (a list joined by `` | ``), or the raw
    reply when it broke the format (the official script reads every reply as raw text)."""
    if sample.error is None and sample.values.get(field) not in (None, ""):
        value = sample.values[field]
        return " | ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    return sample.completion


# ---------------------------------------------------------------------------- recipes
@dataclass
class Job:
    """What a recipe needs to build one question's pairs.

    Attributes:
        program: The program whose stages are sampled.
        example: The training question (``question``, ``answers``, ``type``, ``gold_passage_ids``).
        question_id: The question's id.
        rng: The question's own random generator (seeded from the build seed and the id).
        top_k: Passages per retrieval for this question.
        settings: The sampling settings.
        judge_lm: The LM that judges and labels.
        dataset: The dataset name (chooses the answer metrics).
        ledger: Counts the retrievals.
    """

    program: RAGProgram
    example: Any
    question_id: str
    rng: random.Random
    top_k: int
    settings: Sequence[tuple[float, float]]
    judge_lm: Any
    dataset: str
    ledger: RunLedger


@dataclass
class Built:
    """One question's pairs, and why each stage that gave none gave none."""

    pairs: list[PreferencePair] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    unparsable: int = 0


def _usable(samples: Sequence[Sample], built: Built, *, field: str | None = None) -> list[Sample]:
    ok = [s for s in samples if s.ok and (field is None or s.values.get(field) not in (None, "", []))]
    built.unparsable += len(samples) - len(ok)
    return ok


#: Why a pair is dropped when its two replies answered different prompts.
MIXED_PROMPTS = "the chosen and rejected replies answer different prompts"


def _add_pair(stage: str, job: Job, chosen: Sample, rejected: Sample, built: Built, *, label: str) -> None:
    """Add ``chosen`` over ``rejected`` under the prompt both replies answered; a chosen reply the program
    cannot parse is no example to train towards, an empty rejected reply is no contrast, and a reply that
    answered another prompt (DSPy's JSON-adapter retry) is no reply to this one."""
    if not chosen.ok:
        built.dropped[stage] = "the chosen reply breaks the stage's format"
    elif not rejected.completion.strip():
        built.dropped[stage] = "the rejected reply is empty"
    elif rejected.messages != chosen.messages:
        built.dropped[stage] = MIXED_PROMPTS
    else:
        built.pairs.append(pair_of(stage, job.question_id, chosen, rejected, label=label))


def _draw_pair(
    stage: str, job: Job, positives: list[Sample], negatives: list[Sample], built: Built, *, label: str
) -> None:
    """One positive that parses and one negative that answered the same prompt, drawn at random (D.3, D.4);
    the stage is dropped without both."""
    positives = [s for s in positives if s.ok]
    if not positives or not negatives:
        built.dropped[stage] = "no positive reply" if not positives else "no negative reply"
        return
    chosen = job.rng.choice(positives)
    # Only negatives on the chosen reply's prompt: a reply parsed on the JSON-adapter retry answered another.
    negatives = [s for s in negatives if s.messages == chosen.messages]
    if not negatives:
        built.dropped[stage] = MIXED_PROMPTS
        return
    rejected = job.rng.choice(negatives)
    _add_pair(stage, job, chosen, rejected, built, label=label)


class Recipe:
    """How one program's stages become preference pairs; subclasses define :meth:`build`."""

    #: The stages the recipe builds pairs for, in the order they are built.
    STAGES: ClassVar[tuple[str, ...]] = ()
    #: The per-stage counts selected when ``--counts`` names none.
    DEFAULT_COUNTS: ClassVar[dict[str, int]] = {}
    #: What labels each stage (written to the manifest).
    LABELS: ClassVar[dict[str, str]] = {}
    #: Whether the recipe needs a judge LM.
    USES_JUDGE: ClassVar[bool] = True

    def check(self, program: RAGProgram) -> None:
        """Raise :class:`ConfigError` when ``program`` is not built the way the recipe needs."""

    def build(self, job: Job) -> Built:
        raise NotImplementedError


class DeepNoteRecipe(Recipe):
    """DNAlign (DeepNote Appendix D): note initialization and query refinement judged best/worst by the judge
    LM, knowledge accumulation labelled by NoteCompare, task-oriented generation by the task metric.

    Example:
        >>> DeepNoteRecipe.DEFAULT_COUNTS
        {'note_init': 1900, 'query_refine': 1900, 'note_update': 1900, 'answer': 300}
    """

    STAGES: ClassVar[tuple[str, ...]] = ("note_init", "query_refine", "note_update", "answer")
    DEFAULT_COUNTS: ClassVar[dict[str, int]] = {
        "note_init": 1900,
        "query_refine": 1900,
        "note_update": 1900,
        "answer": 300,
    }
    LABELS: ClassVar[dict[str, str]] = {
        "note_init": "judge LM: best and worst of the sampled notes (no pair: the last note carried on)",
        "query_refine": "judge LM: best and worst of the sampled query sets (no pair: the last carried on)",
        "note_update": "NoteCompare (judge LM): better = positive, not better or unparsable = negative",
        "answer": "vanilla-RAG answers: the official string rules and the task metric; exact = positive, "
        "missing the gold answer = negative",
    }

    def build(self, job: Job) -> Built:
        program, question, built = job.program, job.example.question, Built()
        passages = program.retrieve(job.ledger, question, job.top_k)
        rendered = format_passages(passages)
        self._answer(job, rendered, built)

        # D.1: initial notes, judged; without a pair the last note is carried forward (the official rule).
        notes = _sampled(program.note_init, {"question": question, "passages": rendered}, job, built)
        best_note = self._judged(
            "note_init",
            "notes",
            job,
            notes,
            [shown_text(s, "note") for s in notes],
            {"passages": rendered},
            built,
        )
        if best_note is None:
            built.dropped.setdefault("query_refine", "no initial note to refine from")
            built.dropped.setdefault("note_update", "no initial note to update")
            return built
        note = shown_text(best_note, "note")

        # D.2: query sets proposed from the best (or carried) initial note, judged the same way.
        refine_inputs = {"question": question, "best_note": note, "asked_queries": []}
        query_sets = _sampled(program.query_refine, refine_inputs, job, built)
        best_queries = self._judged(
            "query_refine",
            "queries",
            job,
            query_sets,
            [shown_text(s, "queries") for s in query_sets],
            {"note": note, "asked_queries": []},
            built,
        )
        if best_queries is None:
            built.dropped.setdefault("note_update", "no query set to retrieve with")
            return built

        # D.3: updates of the note with the best queries' passages, labelled by NoteCompare.
        if best_queries.ok and best_queries.values.get("queries"):
            queries = [str(q) for q in best_queries.values["queries"]]
        else:  # a reply that broke the format is retrieved with as raw text, as the official script does
            queries = [best_queries.completion] if best_queries.completion.strip() else []
        text = retrieval_text(queries, question, token_limit=query_token_limit(program.retriever))
        new_passages = program.retrieve(job.ledger, text, job.top_k)
        update_inputs = {"question": question, "best_note": note, "passages": format_passages(new_passages)}
        updates = [
            s for s in _sampled(program.note_update, update_inputs, job, built) if s.completion.strip()
        ]

        def compare(sample: Sample) -> bool | None:
            try:
                with dspy.context(lm=job.judge_lm):
                    verdict = program.note_compare(
                        question=question, best_note=note, updated_note=shown_text(sample, "updated_note")
                    )
            except AdapterParseError:
                return None
            return decision_value(verdict, "better")[0]

        verdicts = run_concurrently(compare, updates)
        built.unparsable += sum(v is None for v in verdicts)
        # DeepNote's own fallback at inference: an unparsable NoteCompare means "not better", a negative.
        positives = [s for s, v in zip(updates, verdicts, strict=True) if v]
        negatives = [s for s, v in zip(updates, verdicts, strict=True) if not v]
        _draw_pair("note_update", job, positives, negatives, built, label="note_compare")
        return built

    def _answer(self, job: Job, rendered: list[str], built: Built) -> None:
        """D.4: vanilla RAG's answers from the same passages, labelled by the task metric and, for short
        answers, by the official script's string rules (:func:`official_answer_labels`)."""
        info = get_dataset_info(job.dataset)
        predictor = dspy.Predict(answer_signature(job.program.task, "passages"))
        inputs = {"question": job.example.question, "passages": rendered}
        answers = [s for s in _sampled(predictor, inputs, job, built) if s.completion.strip()]
        texts = [shown_text(s, "answer") for s in answers]
        exact = "exact_match" if "exact_match" in info.metrics else info.primary_metric
        positive = {i for i, text in enumerate(texts) if score_metric(exact, job.example, text) == 1.0}
        negative = {
            i for i, text in enumerate(texts) if score_metric(info.primary_metric, job.example, text) == 0.0
        }
        label = f"metric:{exact}=1 vs {info.primary_metric}=0"
        if info.task == "short":
            gold = [str(a) for a in job.example.get("answers") or [] if str(a).strip()]
            chosen, rejected = official_answer_labels(texts, gold, positive, negative)
            positive, negative = chosen, rejected
            label += ", with the official string rules"
        negative -= positive
        _draw_pair(
            "answer",
            job,
            [answers[i] for i in sorted(positive)],
            [answers[i] for i in sorted(negative)],
            built,
            label=label,
        )

    def _judged(
        self,
        stage: str,
        kind: str,
        job: Job,
        samples: list[Sample],
        candidates: list[str],
        context: dict[str, Any],
        built: Built,
    ) -> Sample | None:
        """Ask the judge for the best and worst of every reply (those that break the format included); add
        the pair; return the best sample, or the last one when the verdict names no pair (the official
        script's rule: a tie, a missing number or an unparsable verdict carries its last reply forward)."""
        if not samples:
            built.dropped[stage] = "no replies"
            return None
        if len(samples) < 2:
            built.dropped[stage] = f"{len(samples)} reply of {len(job.settings)}"
            return samples[-1]
        best, worst, why = judge_best_worst(
            kind,  # type: ignore[arg-type]
            job.judge_lm,
            question=job.example.question,
            context=context,
            candidates=candidates,
        )
        if best is None or worst is None:
            built.dropped[stage] = why or "judge named no pair"
            if why == "judge reply unparsable":
                built.unparsable += 1
            return samples[-1]
        _add_pair(stage, job, samples[best], samples[worst], built, label="judge")
        return samples[best]


def _sampled(
    predictor: Callable[..., Any], inputs: Mapping[str, Any], job: Job, built: Built
) -> list[Sample]:
    """Every reply of a stage under the job's settings; the unparsable ones are counted, not dropped."""
    samples = sample_stage(predictor, inputs, job.settings)
    built.unparsable += sum(s.error is not None for s in samples)
    return samples


def official_answer_labels(
    texts: Sequence[str], answers: Sequence[str], positive: set[int], negative: set[int]
) -> tuple[set[int], set[int]]:
    """The official data script's answer labels (``LLM_score_rag``) joined with the metric's.

    Chosen: a reply equal to the gold answer (stripped, lowercased), besides the metric's ``positive``;
    when there is none, a reply containing the gold answer and shorter than twice it. Rejected: a reply not
    containing the gold answer, besides the metric's ``negative``; when there is none, a reply longer than
    twice the gold answer. With several gold aliases, a reply is chosen or kept from rejection by any of
    them.

    Args:
        texts: The replies (parsed answers, or raw text for replies that broke the format).
        answers: The gold answer aliases.
        positive: Indices the metric labels positive.
        negative: Indices the metric labels negative.

    Returns:
        ``(chosen, rejected)`` index sets.

    Example:
        >>> official_answer_labels(["Paris", "it is Paris", "Lyon"], ["paris"], set(), set())
        ({0}, {2})
        >>> official_answer_labels(["Paris!", "Lyon"], ["Paris"], set(), set())
        ({0}, {1})
    """
    gold = [a for a in answers if a.strip()]
    if not gold:
        return set(positive), set(negative)
    chosen = set(positive) | {
        i for i, t in enumerate(texts) if any(t.strip().lower() == a.lower() for a in gold)
    }
    rejected = set(negative) | {
        i for i, t in enumerate(texts) if not any(a.lower() in t.lower() for a in gold)
    }
    if not chosen:
        chosen = {
            i
            for i, t in enumerate(texts)
            if any(a.strip().lower() in t.lower() and len(t) < 2 * len(a) for a in gold)
        }
    if not rejected:
        rejected = {i for i, t in enumerate(texts) if all(len(t.strip()) > 2 * len(a) for a in gold)}
    return chosen, rejected


class HANRAGRecipe(Recipe):
    """Beyond the paper: pairs for HANRAG's decision stages, labelled by the dataset instead of a judge.

    * ``route``: the nine routes of the question; positive = the route the question's type implies (as
      HANRAG-Oracle maps types: multi-hop types -> ``complex``, ``single-hop`` -> ``single-step``), negative =
      any other; questions whose type implies no route are skipped.
    * ``filter``: the per-passage relevance verdicts on one gold and one non-gold passage among the
      question's top-k; positive = the verdict that agrees with the gold passage ids.

    Example:
        >>> HANRAGRecipe.STAGES
        ('route', 'filter')
    """

    STAGES: ClassVar[tuple[str, ...]] = ("route", "filter")
    DEFAULT_COUNTS: ClassVar[dict[str, int]] = {}
    LABELS: ClassVar[dict[str, str]] = {
        "route": "the question type's route (HANRAG-Oracle's mapping) = positive, another route = negative",
        "filter": "the verdict agreeing with the gold passage ids = positive, the other = negative",
    }
    USES_JUDGE: ClassVar[bool] = False

    def check(self, program: RAGProgram) -> None:
        if (
            getattr(program, "filter_mode", None) != "per_passage"
            or getattr(program, "decisions", "") != "generate"
        ):
            raise ConfigError(
                "HANRAG preference pairs need the per-passage filter answering yes/no: "
                "--set filter_mode=per_passage --set decisions=generate"
            )

    def build(self, job: Job) -> Built:
        program, question, built = job.program, job.example.question, Built()
        gold_route = oracle_route(job.example.get("type"))
        if gold_route is None:
            built.dropped["route"] = f"question type {job.example.get('type')!r} implies no route"
        else:
            routes = _usable(
                sample_stage(program.route, {"question": question}, job.settings), built, field="category"
            )
            positives = [s for s in routes if str(s.values["category"]) == gold_route]
            negatives = [s for s in routes if str(s.values["category"]) != gold_route]
            _draw_pair("route", job, positives, negatives, built, label=f"question type -> {gold_route}")

        gold = {str(i) for i in job.example.get("gold_passage_ids") or []}
        if not gold:
            built.dropped["filter"] = "the question has no gold passage ids"
            return built
        passages = program.retrieve(job.ledger, question, job.top_k)
        picked = [
            p
            for p in (
                next((p for p in passages if p.id in gold), None),
                next((p for p in passages if p.id not in gold), None),
            )
            if p is not None
        ]
        if not picked:
            built.dropped["filter"] = "nothing retrieved"
        filter_predictor = program.filter.per_passage  # type: ignore[attr-defined]
        for passage in picked:
            relevant = passage.id in gold
            verdicts = _usable(
                sample_stage(
                    filter_predictor, {"question": question, "passage": passage.render()}, job.settings
                ),
                built,
                field=None,
            )
            positives = [s for s in verdicts if bool(s.values.get("relevant")) is relevant]
            negatives = [s for s in verdicts if bool(s.values.get("relevant")) is not relevant]
            _draw_pair("filter", job, positives, negatives, built, label="gold passage ids")
        return built


#: Programs whose stages can be built into preference pairs, and their recipes.
RECIPES: dict[str, type[Recipe]] = {
    "deepnote": DeepNoteRecipe,
    "adaptive-note": DeepNoteRecipe,
    "hanrag": HANRAGRecipe,
    "hanrag-oracle": HANRAGRecipe,
}


def recipe_for(program_name: str) -> Recipe:
    """The recipe of a program.

    Raises:
        ConfigError: for a program without one (the message lists those with one).
    """
    try:
        return RECIPES[program_name]()
    except KeyError:
        raise ConfigError(
            f"no preference-pair recipe for program {program_name!r}; available: {', '.join(RECIPES)}"
        ) from None


# ---------------------------------------------------------------------------- the build
@dataclass
class BuildResult:
    """What :func:`build_preferences` returns.

    Attributes:
        pairs: The selected pairs (what ``train.jsonl`` holds).
        stages: Per stage: ``available``, ``asked`` and ``selected`` pair counts.
        questions: Questions finished without error.
        errors: Questions that failed (recorded, retried on the next run).
        summary: The dict written to ``summary.json``.
        train_file: The path of ``train.jsonl``, when an output directory was given.
    """

    pairs: list[PreferencePair]
    stages: dict[str, dict[str, int | None]]
    questions: int
    errors: int
    summary: dict[str, Any]
    train_file: Path | None = None


class _Fatal(Exception):
    pass


def question_rng(seed: int, question_id: str) -> random.Random:
    """The random generator of one question: the same for a question whatever the thread order or resume."""
    return random.Random(f"{seed}:{question_id}")


def sample_questions(examples: Sequence[Any], samples: int | None, *, seed: int) -> list[Any]:
    """``samples`` questions drawn at random (seeded), as the paper samples 15,000 of 2Wiki's train set.

    Raises:
        ConfigError: asking for more questions than there are.
    """
    if samples is None:
        return list(examples)
    if samples < 1:
        raise ConfigError(f"--samples must be >= 1, not {samples}")
    if samples > len(examples):
        raise ConfigError(
            f"--samples {samples} asks for more questions than the {len(examples)} available; "
            f"use --samples {len(examples)} or more questions"
        )
    indices = sorted(random.Random(seed).sample(range(len(examples)), samples))
    return [examples[i] for i in indices]


def _build_one(
    recipe: Recipe,
    program: RAGProgram,
    example: Any,
    ex_id: str,
    *,
    seed: int,
    top_ks: Sequence[int],
    settings: Sequence[tuple[float, float]],
    judge_lm: Any,
    dataset: str,
) -> dict[str, Any]:
    counter, usage = CallCounter(), TokenUsage()
    overrides = {
        "track_usage": True,
        "usage_tracker": usage,
        "callbacks": [*dspy.settings.get("callbacks", []), counter],
    }
    rng = question_rng(seed, ex_id)
    top_k = rng.choice(list(top_ks))
    ledger = RunLedger(str(example.question))
    started = time.perf_counter()
    built, error = Built(), None
    with dspy.context(**overrides):
        try:
            job = Job(program, example, ex_id, rng, top_k, settings, judge_lm, dataset, ledger)
            built = recipe.build(job)
        except RagsuiteError as exc:
            error = {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}
        except Exception as exc:
            fatal = explain_lm_error(exc, model=getattr(dspy.settings.get("lm"), "model", None))
            if fatal is not None:
                raise _Fatal(fatal) from exc
            error = {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}
    prompt_tokens, completion_tokens, by_lm = usage.tokens()
    counts = Counter(pair.stage for pair in built.pairs)
    return {
        "id": ex_id,
        "question": example.question,
        "error": error,
        "latency_s": round(time.perf_counter() - started, 4),
        "top_k": top_k,
        "metrics": {stage: counts.get(stage, 0) for stage in recipe.STAGES},
        "dropped": built.dropped,
        "stats": {"lm_calls": counter.calls, "retrievals": ledger.retrievals, "unparsable": built.unparsable},
        "tokens": {
            "input": prompt_tokens,
            "output": completion_tokens,
            "requests": usage.requests,
            "cache_hits": max(counter.calls - usage.requests, 0),
            "by_lm": by_lm,
        },
        "pairs": [pair.to_dict() for pair in built.pairs],
    }


def build_preferences(
    program: RAGProgram,
    examples: Sequence[Any],
    *,
    dataset: str,
    judge_lm: Any,
    out_dir: str | Path,
    recipe: Recipe | None = None,
    settings: Sequence[tuple[float, float]] = SAMPLING_GRID,
    top_ks: Sequence[int] = TOP_KS,
    counts: Mapping[str, int | None] | None = None,
    seed: int = 0,
    threads: int = 4,
    progress: bool = False,
    manifest: Mapping[str, Any] | None = None,
    max_errors: int | None = None,
) -> BuildResult:
    """Build preference pairs for ``program``'s stages from ``examples``; resumable in ``out_dir``.

    The generating LM is the context's (``dspy.configure(lm=...)`` / ``dspy.context``); ``judge_lm`` judges
    and labels. ``out_dir`` receives ``manifest.json``, ``records.jsonl`` (one question's pairs a line,
    appended as each finishes), ``summary.json`` and ``train.jsonl`` (the selected pairs, TRL format).

    Args:
        program: A program with a recipe (:data:`RECIPES`).
        examples: The questions (already sampled; see :func:`sample_questions`).
        dataset: Dataset name (the answer metrics).
        judge_lm: The judging and labelling LM.
        out_dir: The build directory; rerunning with the same settings resumes.
        recipe: Default: the program's.
        settings: ``(temperature, top_p)`` settings each stage is sampled with.
        top_ks: Top-k values, one drawn per question.
        counts: Pairs to select per stage (``None``: all); default: the recipe's.
        seed: Seeds the per-question draws and the selection.
        threads: Questions built at once (each samples its nine settings concurrently).
        progress: Show a progress bar.
        manifest: Saved as ``manifest.json``; resuming with another configuration is refused.
        max_errors: Stop after this many failed questions.

    Returns:
        :class:`BuildResult`.

    Raises:
        ConfigError: bad arguments, or ``out_dir`` holding another build.
        LMEndpointError: an LM error no retry can fix (bad key, unknown model, unreachable server).
    """
    recipe = recipe or recipe_for(program.name)
    recipe.check(program)
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, not {threads}")
    if not settings:
        raise ConfigError("give at least one (temperature, top_p) setting")
    if not top_ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in top_ks):
        raise ConfigError(f"top-k values must be integers >= 1, not {list(top_ks)}")
    counts = dict(recipe.DEFAULT_COUNTS if counts is None else counts)
    ids = [example_id(ex, i) for i, ex in enumerate(examples)]
    if len(set(ids)) != len(ids):
        raise ConfigError("question ids must be unique")
    manifest = dict(manifest or default_build_manifest(program, recipe, dataset, ids, settings, top_ks, seed))
    manifest["counts"] = counts
    with lock_directory(out_dir):
        store = RunStore(out_dir, config_keys=BUILD_CONFIG_KEYS)
        try:
            store.check_manifest(manifest)
            done = {i: r for i, r in store.load_records().items() if i in set(ids)}
            if done:
                log.info("resuming %s: %d of %d questions already built", store.dir, len(done), len(ids))
            new, stopped = _run(
                recipe,
                program,
                [(ex, i) for ex, i in zip(examples, ids, strict=True) if i not in done],
                store=store,
                total=len(ids),
                initial=len(done),
                seed=seed,
                top_ks=top_ks,
                settings=settings,
                judge_lm=judge_lm,
                dataset=dataset,
                threads=threads,
                progress=progress,
                max_errors=max_errors,
            )
        finally:
            store.close()
        by_id = {**done, **new}
        records = [by_id[i] for i in ids if i in by_id]
        result = _finish(records, recipe, counts, seed=seed, total=len(ids), out_dir=Path(out_dir))
        result.summary["stopped"] = stopped
        atomic_write_text(Path(out_dir) / SUMMARY, redact(json_text(result.summary, indent=2)) + "\n")
    if stopped and stopped.startswith("LM endpoint"):
        raise LMEndpointError(stopped)
    return result


def _run(
    recipe: Recipe,
    program: RAGProgram,
    todo: list[tuple[Any, str]],
    *,
    store: RunStore,
    total: int,
    initial: int,
    seed: int,
    top_ks: Sequence[int],
    settings: Sequence[tuple[float, float]],
    judge_lm: Any,
    dataset: str,
    threads: int,
    progress: bool,
    max_errors: int | None,
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Build the questions in ``todo`` concurrently, appending each record as it finishes."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=initial, desc="align build", unit="q", dynamic_ncols=True)
    new: dict[str, dict[str, Any]] = {}
    pairs = Counter[str]()
    errors, calls, stopped = 0, 0, None
    lock = threading.Lock()
    options = {
        "seed": seed,
        "top_ks": top_ks,
        "settings": settings,
        "judge_lm": judge_lm,
        "dataset": dataset,
    }
    pending = iter(todo)
    running: set[Future[dict[str, Any]]] = set()
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ragsuite-align")

    def submit() -> bool:
        item = next(pending, None)
        if item is None:
            return False
        context = contextvars.copy_context()
        running.add(pool.submit(context.run, _build_one, recipe, program, item[0], item[1], **options))
        return True

    try:
        for _ in range(threads):
            if not submit():
                break
        while running:
            finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in finished:
                running.discard(future)
                try:
                    record = future.result()
                except _Fatal as exc:
                    stopped = f"LM endpoint unusable: {exc}"
                    continue
                with lock:
                    store.append(record)
                    new[record["id"]] = record
                if record["error"]:
                    errors += 1
                    log.warning("question %s failed: %s", record["id"], record["error"]["message"])
                    if max_errors is not None and errors >= max_errors and stopped is None:
                        stopped = f"max_errors={max_errors} reached"
                pairs.update({k: v for k, v in record["metrics"].items() if v})
                calls += int(record["stats"].get("lm_calls", 0))
                if bar is not None:
                    bar.update(1)
                    shown = " ".join(f"{stage}={pairs.get(stage, 0)}" for stage in recipe.STAGES)
                    bar.set_postfix_str(f"pairs {shown} err={errors} calls={calls}", refresh=False)
                if stopped is None:
                    submit()
    except KeyboardInterrupt:
        stopped = "interrupted"
        for future in running:
            future.cancel()
        raise
    finally:
        pool.shutdown(wait=stopped is None, cancel_futures=True)
        if bar is not None:
            bar.close()
    return new, stopped


def _finish(
    records: Sequence[Mapping[str, Any]],
    recipe: Recipe,
    counts: Mapping[str, int | None],
    *,
    seed: int,
    total: int,
    out_dir: Path | None,
) -> BuildResult:
    """Select the per-stage counts from every finished question's pairs, write ``train.jsonl``, summarize."""
    finished = [r for r in records if not r.get("error")]
    all_pairs = [PreferencePair.from_dict(p) for r in finished for p in r.get("pairs") or []]
    selected, stages = select_pairs(all_pairs, {s: counts.get(s) for s in recipe.STAGES}, seed=seed)
    dropped: dict[str, Counter[str]] = {stage: Counter() for stage in recipe.STAGES}
    for record in finished:
        for stage, why in (record.get("dropped") or {}).items():
            dropped.setdefault(stage, Counter())[why] += 1
    short = [
        f"{stage}: asked {info['asked']}, only {info['available']} available"
        for stage, info in stages.items()
        if info["asked"] is not None and info["available"] < info["asked"]  # type: ignore[operator]
    ]

    def total_of(get: Callable[[Mapping[str, Any]], Any]) -> int:
        return sum(int(get(r) or 0) for r in finished)

    summary = {
        "questions": len(finished),
        "errors": len(records) - len(finished),
        "total": total,
        "complete": len(finished) == total,
        "stages": stages,
        "dropped": {stage: dict(reasons) for stage, reasons in dropped.items()},
        "short_of_counts": short,
        "cost": {
            "lm_calls": total_of(lambda r: r["stats"].get("lm_calls")),
            "lm_requests": total_of(lambda r: r["tokens"].get("requests")),
            "cache_hits": total_of(lambda r: r["tokens"].get("cache_hits")),
            "input_tokens": total_of(lambda r: r["tokens"].get("input")),
            "output_tokens": total_of(lambda r: r["tokens"].get("output")),
            "retrievals": total_of(lambda r: r["stats"].get("retrievals")),
            "unparsable_replies": total_of(lambda r: r["stats"].get("unparsable")),
        },
    }
    train_file = None
    if out_dir is not None:
        train_file = write_trl(selected, out_dir / TRAIN_FILE)
        summary["train_file"] = TRAIN_FILE
    for line in short:
        log.warning("fewer pairs than asked: %s", line)
    return BuildResult(
        pairs=selected,
        stages=stages,
        questions=len(finished),
        errors=len(records) - len(finished),
        summary=summary,
        train_file=train_file,
    )


def default_build_manifest(
    program: RAGProgram,
    recipe: Recipe,
    dataset: str,
    ids: Sequence[str],
    settings: Sequence[tuple[float, float]],
    top_ks: Sequence[int],
    seed: int,
) -> dict[str, Any]:
    """What a build is, for ``manifest.json`` (the CLI adds the LMs, split and versions)."""
    return {
        "program": program.name,
        "knobs": program.knobs(),
        "dataset": dataset,
        "seed": seed,
        "sampling": [list(s) for s in settings],
        "top_ks": list(top_ks),
        "stages": list(recipe.STAGES),
        "labels": dict(recipe.LABELS),
        "judge_prompts": judge_instructions(),
        "examples_sha256": examples_fingerprint(ids),
        "n_examples": len(ids),
    }


def format_build_table(summary: Mapping[str, Any]) -> str:
    """A Markdown table of the pairs per stage: available, asked, selected, and the commonest drop reason."""
    lines = [
        "| stage | pairs available | asked | selected | most common reason for no pair |",
        "|---|---|---|---|---|",
    ]
    for stage, info in summary["stages"].items():
        reasons = summary.get("dropped", {}).get(stage) or {}
        reason = max(reasons.items(), key=lambda item: item[1]) if reasons else None
        why = f"{reason[0]} ({reason[1]})" if reason else "–"
        asked = "all" if info["asked"] is None else str(info["asked"])
        lines.append(f"| {stage} | {info['available']} | {asked} | {info['selected']} | {why} |")
    return "\n".join(lines)


__all__ = [
    "BUILD_CONFIG_KEYS",
    "RECIPES",
    "SAMPLING_GRID",
    "TOP_KS",
    "BuildResult",
    "DeepNoteRecipe",
    "HANRAGRecipe",
    "Job",
    "Recipe",
    "build_preferences",
    "default_build_manifest",
    "format_build_table",
    "question_rng",
    "recipe_for",
    "sample_questions",
    "sample_stage",
]
