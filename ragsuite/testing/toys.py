"""A toy world with a known optimum, for testing optimizers: a program, its retriever, questions and a
scripted LM, all in memory.

The scripted answer is right only when the program sees the gold passage (ranked 5th, so top_k >= 5),
no misleading passage (ranked 6th and 7th, so top_k <= 5) and exactly two notes (max_step == 2): the
search space {top_k: 1, 3, 5, 7} x {max_step: 1, 2, 3} has the unique optimum top_k=5, max_step=2. An
instruction an optimizer rewrote (its proposals come from :func:`responder`) always answers right, so
optimizers that keep the best candidate have something to find.

Example:
    >>> import dspy
    >>> program = ToyProgram(retriever=ToyRetriever(), top_k=5, max_step=2)
    >>> with dspy.context(lm=scripted_lm()):
    ...     program(question=question(3)).answer
    'Answer3'
"""

from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Iterator, Sequence
from typing import Any

import dspy

from ragsuite.programs.base import _REGISTRY, RAGProgram, register
from ragsuite.programs.knobs import Ints, Knobs, OneOf, integer
from ragsuite.retrieval.base import Passage
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

N_QUESTIONS = 8


def question(i: int) -> str:
    """The ``i``-th question of the toy world."""
    return f"What is the code name of project {i}?"


def examples(n: int = N_QUESTIONS) -> list[dspy.Example]:
    """The first ``n`` questions as examples (``answers``, ``gold_passage_ids``), ``question`` as input."""
    return [
        dspy.Example(
            id=f"q{i}", question=question(i), answers=[f"Answer{i}"], gold_passage_ids=[f"gold{i}"], type=""
        ).with_inputs("question")
        for i in range(n)
    ]


class ToyRetriever:
    """Ranks four fillers, then the gold passage, then two misleading passages."""

    def __call__(self, query: str, k: int) -> list[Passage]:
        i = next((j for j in range(N_QUESTIONS) if question(j) in query), 0)
        ranked = [Passage(f"filler{i}-{j}", f"Filler {j}", f"Nothing about project {i}.") for j in range(4)]
        ranked.append(Passage(f"gold{i}", f"Project {i}", f"GOLD project {i} is code-named Answer{i}."))
        ranked += [Passage(f"mislead{i}-{j}", "Rumor", f"MISLEADING rumor {j}.") for j in range(2)]
        return ranked[:k]

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self(q, k) for q in queries]

    def describe(self) -> dict[str, Any]:
        return {"kind": "toy", "spec": "toy:in-memory"}


class Hop(dspy.Signature):
    """Write a short note about the question."""

    question: str = dspy.InputField()
    note: str = dspy.OutputField()


class Answer(dspy.Signature):
    """Answer the question from the passages and notes."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField()
    notes: list[str] = dspy.InputField()
    answer: str = dspy.OutputField()


class ToyProgram(RAGProgram):
    """Retrieve top_k, take max_step note steps, answer."""

    name = "toy-opt"
    KNOBS = ("top_k", "max_step")

    def __init__(
        self, *, retriever: Any = None, task: str = "short", top_k: int = 3, max_step: int = 1
    ) -> None:
        super().__init__(retriever=retriever, task=task)  # type: ignore[arg-type]
        self.top_k = top_k
        self.max_step = max_step
        self.hop = dspy.Predict(Hop)
        self.answer = dspy.ChainOfThought(Answer)

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {
            "top_k": trial.suggest_categorical("top_k", [1, 3, 5, 7]),
            "max_step": trial.suggest_int("max_step", 1, 3),
        }

    def forward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages = self.retrieve(ledger, question, self.top_k)
        notes = []
        for step in range(self.max_step):
            ledger.count_step()
            hop = self.call_stage(ledger, "hop", self.hop, question=question)
            notes.append(f"note-{step}: {hop.note}")
            ledger.record("hop", passage_ids=[p.id for p in passages])
        pred = self.call_stage(
            ledger,
            "answer",
            self.answer,
            question=question,
            passages=[p.render() for p in passages],
            notes=notes,
        )
        return self.finish(ledger, pred.answer, passages)


class KnobbedToy(ToyProgram):
    """The toy program with its knobs declared as :class:`~ragsuite.programs.knobs.Knobs` (the same search
    space), so that a tuning run can fix knobs, narrow the search or start from a program file."""

    name = "toy-knobs"
    KNOBS = Knobs(
        integer("top_k", 3, minimum=1, search=OneOf((1, 3, 5, 7)), help="passages retrieved"),
        integer("max_step", 1, minimum=1, search=Ints(1, 3), help="note steps"),
    )

    search_space = RAGProgram.__dict__["search_space"]

    def __init__(self, *, retriever: Any = None, task: str = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **self.KNOBS.check(knobs, program=self.name))


class NoSpaceProgram(ToyProgram):
    """The toy program with the base class's search space, which samples nothing (its knobs are plain
    names)."""

    name = "toy-no-space"

    search_space = RAGProgram.__dict__["search_space"]


def responder(request: ScriptedRequest) -> dict[str, Any] | str:
    """Answers every requested field; the answer field follows the knob rule in the module docstring."""
    values: dict[str, Any] = {}
    for name in request.output_fields:
        if name == "answer":
            values[name] = toy_answer(request)
        elif name == "note":
            values[name] = "a note"
        else:
            values[name] = f"Scripted {name}: answer the question using the passages and notes."
    if "Respond with a JSON object" in request.user:
        # GEPA's instruction proposer formats its prompt with DSPy's JSONAdapter.
        return json.dumps(values)
    return values


def toy_answer(request: ScriptedRequest) -> str:
    """The answer field's reply: right only under the rule in the module docstring."""
    passages = request.inputs.get("passages", "")
    notes = request.inputs.get("notes", "")
    q = request.inputs.get("question", "")
    i = next((j for j in range(N_QUESTIONS) if question(j) in q), None)
    if i is None:
        return "unknown"
    if "Scripted" in request.instructions:
        # An instruction rewritten by an optimizer (its proposals come from this responder) always works,
        # so optimizers that keep the best candidate have something to find.
        return f"Answer{i}"
    if "MISLEADING" in passages:
        return "Rumor"
    if f"GOLD project {i}" in passages and notes.count("note-") == 2:
        return f"Answer{i}"
    return "unknown"


def scripted_lm() -> ScriptedLM:
    """A scripted LM answering with :func:`responder`."""
    return ScriptedLM(responder)


def exact(example: Any, prediction: Any, trace: Any = None) -> float:
    """Exact match against the example's answers (a DSPy metric)."""
    return float(str(prediction.answer).strip() in example.answers)


def toy_evaluate(
    program: Any,
    examples: Sequence[dspy.Example],
    *,
    dataset: str,
    threads: int = 1,
    progress: bool = False,
    on_record: Any = None,
    **_: Any,
) -> Any:
    """A serial stand-in for ``ragsuite.evaluation.evaluate`` with the same result shape."""
    records = []
    for example in examples:
        pred = program(question=example.question)
        stats = pred.stats
        record = {
            "id": example.id,
            "answer": pred.answer,
            "metrics": {"accuracy": exact(example, pred)},
            "cost": {
                "lm_calls": stats["lm_calls"],
                "retrievals": stats["retrievals"],
                "input_tokens": 0,
                "output_tokens": 0,
            },
        }
        records.append(record)
        if on_record is not None:
            on_record(record)
    n = len(records)
    mean = lambda key, part: sum(r[part][key] for r in records) / n  # noqa: E731
    return types.SimpleNamespace(
        metrics={"accuracy": mean("accuracy", "metrics")},
        cost={k: mean(k, "cost") for k in ("lm_calls", "retrievals", "input_tokens", "output_tokens")},
        n=n,
        errors=0,
        records=records,
    )


def tune_options(out_dir: Any = None, **changes: Any) -> dict[str, Any]:
    """The settings of a toy tuning study: :class:`ToyProgram` (``program``) on 4 toy questions with the
    scripted LM and the toy retriever, 2 trials, one thread, seed 0, its files under ``out_dir``; ``changes``
    replace or add settings. With ``program`` popped (``tune``'s first argument), the keyword arguments of
    ``ragsuite.optimizers.tune``; as they are, those of its ``TuneConfig``."""
    options: dict[str, Any] = dict(
        program=ToyProgram,
        dataset="hotpotqa",
        valset=examples(4),
        retriever=ToyRetriever(),
        lm=scripted_lm(),
        trials=2,
        out_dir=out_dir,
        threads=1,
        seed=0,
    )
    options.update(changes)
    return options


def run_worker(storage: str, seed: int, trials: int, barrier: str = "", workers: int = 2) -> None:
    """One tuning process sharing ``storage`` with others (each run in a process of its own). With a
    ``barrier`` folder, it waits until ``workers`` processes are ready so that all of them take part."""
    import time
    from pathlib import Path

    import dspy

    from ragsuite.optimizers import tune

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    if barrier:
        Path(barrier, f"ready-{seed}").touch()
        deadline = time.monotonic() + 120
        while len(list(Path(barrier).glob("ready-*"))) < workers and time.monotonic() < deadline:
            time.sleep(0.002)  # a tight start, so that the workers really race
    options = tune_options(trials=trials, storage=storage, study_name="shared", seed=seed)
    tune(options.pop("program"), **options)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """Register :class:`ToyProgram` and :class:`KnobbedToy` for the duration (program files name registered
    programs only), then remove them, so the registry holds the shipped programs alone again."""
    toys = (ToyProgram, KnobbedToy)
    for toy in toys:
        register(toy)
    try:
        yield
    finally:
        for toy in toys:
            _REGISTRY.pop(toy.name, None)
