"""IRCoT and Adaptive-RAG, the multi-step baselines of the HANRAG paper (Tables 1-2).

IRCoT (Trivedi et al., 2023, "Interleaving Retrieval with Chain-of-Thought Reasoning"; the authors' code,
github.com/StonyBrookNLP/ircot, ``commaqa/inference/ircot.py`` and ``base_configs/ircot_qa_*``):

1. Retrieve ``top_k`` passages for the question; they start the collection.
2. Repeat up to ``max_steps`` times: continue the chain of thought from the question, the collected passages
   and the sentences so far (``NextThought``) and keep only the first sentence of the reply. Stop when the
   sentence is empty or matches the authors' exit test ``.* answer is:? (.*)\\.?`` (``re.match``, case as
   written); otherwise retrieve ``top_k`` passages for the last sentence that is not a reasoning sentence
   (one starting "So", "Thus", "Therefore", "Hence", "That is," or an arithmetic step; the question when
   there is none), with the words who/what/when/where/why/which/how/does/is removed, and add the new ones,
   keeping at most ``max_passages`` in the collection (the authors' 15).
3. A reader answers the question from the collected passages: ``reader="direct"`` answers in the task's
   style (the authors' Flan-T5 configurations); ``reader="cot"`` reasons step by step and the answer is read
   from its "answer is: X" sentence, the whole reply when there is none, a final "." removed (the authors'
   Codex and GPT-3.5 configurations).

Steps count retrievals (the question's and one per non-final sentence), the unit HANRAG reports.

Adaptive-RAG (Jeong et al., 2024; github.com/starsuzi/Adaptive-RAG): a query-complexity classifier routes
each question to A: answer without retrieval, B: one retrieval of ``single_k`` passages (the authors' 15 for
the Flan-T5 runs), or C: IRCoT with ``top_k`` passages per retrieval. The paper trains a small classifier
(T5-Large) on labels from the three strategies' outcomes; ``classifier=DIR`` uses one trained that way by
``ragsuite classifier train`` (:mod:`ragsuite.programs.complexity`), and without it the LM classifies
(``QueryComplexity``). An unparsable class from the LM falls back to B.

LM-output fallbacks (recorded in the trace and ``stats["fallbacks"]``): an unparsable reasoning sentence ends
the reasoning (as an empty sentence does in the original); an unparsable answer is empty.

Differences from the original:

* Sentences. The authors split the completion with spaCy (``en_core_web_sm``); ragsuite ships no spaCy model
  and splits with :func:`first_sentence` (a period, "!" or "?" before a capitalised word, not after a common
  abbreviation or an initial). Why: no model download; the two agree on ordinary prose.
* Prompts. The original continues raw few-shot text ("Q: ... A: <sentences so far>"); ragsuite asks the LM
  through DSPy signatures (``NextThought``, the task's answer signature or ``CoTReader``) with the same
  inputs. Why: every program here runs on any DSPy LM and can be optimised.
* Passages. The original skips retrieved paragraphs over 600 words, drops near-duplicates by fuzzy title and
  text matching, and cuts each paragraph to 350 words in the prompt; ragsuite keeps every passage, drops
  duplicates by id and shows passages whole. Why: ragsuite's corpora are chunked passages with stable ids.
* ``max_steps`` defaults to 8 sentences; the original allows 10 (``max_num_sentences``). Why: HANRAG's
  reported step counts stay under 8; set ``max_steps=10`` for the authors' cap.
* ``top_k`` defaults to 4; the authors tune K in {2, 4, 6, 8} and Adaptive-RAG's runs use 6 (Flan-T5) or 3
  (GPT-3.5) for multi-step and 15 (Flan-T5) or 6 (GPT-3.5) for single-step. Why: one default for every LM;
  the search space covers theirs.
* Adaptive-RAG without ``classifier``: the LM classifies the question (``QueryComplexity``), and an
  unparsable class routes to B; the authors always route with their trained T5 classifier. Why: a
  trained classifier needs three labelled runs first (``ragsuite classifier train``).
* Adaptive Retrieval (:class:`AdaptiveRetrieval`, Mallen et al., 2023) retrieves when the question's entity
  is less popular than a threshold (Wikipedia page views); ragsuite asks the LM whether it needs retrieval
  (``RetrievalNeed``). Why: no popularity data ships with ragsuite's datasets.
* Free-text length. The original bounds a generation by its token limit alone; on an LM that holds replies
  to a JSON schema (the local LM on llama.cpp), ragsuite holds the reasoning sentence
  (``NextThought.thought``) and the CoT reader's reasoning (``CoTReader.reasoning``) to ``TEXT_MAX_CHARS``
  (2,000) characters; other LMs are bound by the token limit alone. Why: a small model that repeats a
  sentence would write to the token limit and leave its JSON cut, and the step would fall back; a reasoning
  sentence in earnest is far shorter.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import invoke
from ragsuite.data.datasets import Task
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.complexity import load_classifier
from ragsuite.programs.knobs import Ints, Knobs, OneOf, choice, integer, path
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.reasoning import CoTReader, NextThought, QueryComplexity, RetrievalNeed

#: IRCoT's exit test and answer extractor (the authors' ``answer_extractor_regex``), applied with ``match``.
ANSWER_IS = re.compile(r".* answer is:? (.*)\.?")
#: Sentences IRCoT does not use as queries (the authors' ``is_reasoning_sentence``).
_REASONING_STARTERS = ("thus ", "thus,", "so ", "so,", "that is,", "therefore", "hence")
_ARITHMETIC = re.compile(r"(.*)(\d[\d,]*\.?\d+|\d+) ([+-]) (\d[\d,]*\.?\d+|\d+) = (\d[\d,]*\.?\d+|\d+)(.*)")
#: Words the authors' BM25 query drops (``remove_wh_words``).
_WH_WORDS = frozenset({"who", "what", "when", "where", "why", "which", "how", "does", "is"})
#: Words whose period does not end a sentence.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof mt ft gen col lt sgt capt rev vs etc e.g i.e no vol jan feb mar apr jun jul "
    "aug sep sept oct nov dec u.s u.k inc ltd co corp".split()
)
_BOUNDARY = re.compile(r"([.!?]+[\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])|\n\s*\n")
#: Route used when the classifier's reply cannot be read: one retrieval is the safe middle.
COMPLEXITY_FALLBACK = "B"
_CLASS = re.compile(r"\b([ABC])\b")


def first_sentence(text: str, *, min_chars: int = 1) -> str:
    """The first sentence of ``text`` at least ``min_chars`` characters long (the whole text when it has no
    boundary): the cut IRCoT and FLARE make to each completion.

    Example:
        >>> first_sentence("Jaws was directed by Steven Spielberg. He was born in Cincinnati.")
        'Jaws was directed by Steven Spielberg.'
        >>> first_sentence("Dr. J. Smith won in 1990. So the answer is: 1990.")
        'Dr. J. Smith won in 1990.'
    """
    for match in _BOUNDARY.finditer(text):
        end = match.end(1) if match.group(1) else match.start()
        if match.group(1) and match.group(1)[0] == ".":
            before = text[: match.start(1)].split()
            word = before[-1].lstrip("\"'([").lower() if before else ""
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        sentence = text[:end].strip()
        if len(sentence) >= min_chars:
            return sentence
    return text.strip()


def is_reasoning_sentence(sentence: str) -> bool:
    """Whether IRCoT skips ``sentence`` as a query: a conclusion ("So ...", "Thus ...") or arithmetic."""
    return sentence.lower().startswith(_REASONING_STARTERS) or bool(_ARITHMETIC.match(sentence))


def reasoning_query(question: str, thoughts: list[str]) -> str:
    """IRCoT's next query: the last sentence that is not a reasoning sentence (else the question), without
    wh-words.

    Example:
        >>> reasoning_query("Who directed Jaws?", ["Jaws is a film.", "So it is a film."])
        'Jaws a film.'
    """
    facts = [t for t in thoughts if not is_reasoning_sentence(t)]
    query = facts[-1].strip() if facts else question
    return " ".join(word for word in query.split(" ") if word.strip().lower() not in _WH_WORDS)


def extract_answer(text: str) -> str:
    """The answer of a reasoning reply: what follows "answer is" (the whole reply when absent), without a
    final period (the authors' ``answer_extractor`` with ``match_all_on_failure``)."""
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1]
    match = ANSWER_IS.match(text)
    answer = match.group(1) if match else text
    return answer[:-1] if answer.endswith(".") else answer


async def ainterleave_reasoning(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    predictor: dspy.Predict,
    *,
    top_k: int,
    max_steps: int,
    max_passages: int,
) -> tuple[list[Passage], list[str]]:
    """IRCoT's retrieve-reason loop (module docstring, steps 1-2). Returns the collected passages and the
    reasoning sentences; records a ``step`` event per sentence and a ``stop`` event."""
    first = await aretrieve_recorded(program, ledger, reasoning_query(question, []), top_k)
    collected = {p.id: p for p in first[:max_passages]}
    ledger.count_step()
    thoughts: list[str] = []
    reason = "max_steps"
    for step in range(1, max_steps + 1):
        output = await program.acall_stage(
            ledger,
            "next_thought",
            predictor,
            fallback={"thought": ""},
            question=question,
            passages=format_passages(list(collected.values())),
            thoughts=list(thoughts),
        )
        reply = " ".join(str(output.thought or "").split())
        thought = first_sentence(reply)
        if not thought:
            reason = "no_thought"
            break
        thoughts.append(thought)
        extra = {"cut": reply[len(thought) :].strip()} if len(thought) < len(reply) else {}
        if ANSWER_IS.match(thought) or step == max_steps:
            reason = "answer" if ANSWER_IS.match(thought) else "max_steps"
            ledger.record("step", step=step, thought=thought, passage_ids=[], **extra)
            break
        query = reasoning_query(question, thoughts)
        hits: list[Passage] = []
        if query.strip():  # the original skips a query left empty by the wh-word removal
            hits = await program.aretrieve(ledger, query, top_k)
            ledger.count_step()
        room = max(0, max_passages - len(collected))
        new = [p for p in hits if p.id not in collected][:room]
        collected.update((p.id, p) for p in new)
        ledger.record(
            "step",
            step=step,
            thought=thought,
            query=query,
            retrieved_ids=[p.id for p in hits],
            passage_ids=[p.id for p in new],
            **extra,
        )
    ledger.record("stop", reason=reason, thoughts=len(thoughts), passages=len(collected))
    return list(collected.values()), thoughts


@register
class IRCoT(RAGProgram):
    """IRCoT: interleave chain-of-thought sentences with retrievals, then read (see the module docstring).

    Stage predictors: ``next_thought``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``top_k=4``).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("ircot").default_knobs()
        {'top_k': 4, 'max_steps': 8, 'max_passages': 15, 'reader': 'direct'}
    """

    name: ClassVar[str] = "ircot"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer(
            "top_k",
            4,
            minimum=1,
            search=OneOf((2, 4, 6, 8)),
            help="passages per retrieval (the paper tunes K in {2, 4, 6, 8})",
        ),
        integer(
            "max_steps", 8, minimum=1, search=Ints(2, 10), help="most reasoning sentences (the authors': 10)"
        ),
        integer(
            "max_passages",
            15,
            minimum=1,
            search=Ints(5, 20),
            help="most passages collected (the paper's cap)",
        ),
        choice(
            "reader",
            "direct",
            ("direct", "cot"),
            help="`direct` (the authors' Flan-T5 runs) or `cot` (their Codex and GPT-3.5 runs)",
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.next_thought = dspy.Predict(NextThought)
        self.answer = dspy.Predict(CoTReader if self.reader == "cot" else answer_signature(task, "passages"))

    async def aread(
        self, ledger: RunLedger, question: str, passages: list[Passage], *, source: str = "passages"
    ) -> str:
        """The reader (module docstring, step 3); with ``reader="cot"`` also Adaptive-RAG's route A, which
        reasons with no passages (the authors' GPT "nor_qa" configuration)."""
        if self.reader == "direct":
            return await arun_answer(
                self, ledger, source="passages", question=question, passages=format_passages(passages)
            )
        output = await self.acall_stage(
            ledger,
            "answer",
            self.answer,
            fallback={"reasoning": ""},
            question=question,
            passages=format_passages(passages),
        )
        reasoning = " ".join(str(output.reasoning or "").split())
        answer = extract_answer(reasoning).strip()
        ledger.record("answer", source=source, answer=answer, reasoning=reasoning)
        return answer

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages, thoughts = await ainterleave_reasoning(
            self,
            ledger,
            question,
            self.next_thought,
            top_k=self.top_k,
            max_steps=self.max_steps,
            max_passages=self.max_passages,
        )
        answer = await self.aread(ledger, question, passages)
        return self.finish(ledger, answer, passages, thoughts=thoughts)


def _salvage_complexity(predictor: dspy.Predict) -> Any:
    """Read a lone class letter from a reply strict parsing refuses ("C.", "Class: B")."""

    async def call(**inputs: Any) -> dspy.Prediction:
        try:
            return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            found = set(_CLASS.findall(str(exc.lm_response or "").split("]]")[-1]))
            if len(found) != 1:
                raise
            return dspy.Prediction(complexity=found.pop(), salvaged=True)

    call.__wrapped__ = predictor  # type: ignore[attr-defined]  # for stage_adapter: the predictor inside
    return call


@register
class AdaptiveRAG(IRCoT):
    """Adaptive-RAG: classify the question's complexity, then answer without retrieval (A), with one
    retrieval (B) or with IRCoT (C).

    Stage predictors: ``classify``, ``direct`` (A), ``next_thought`` (C), ``answer`` (B and C).

    Arguments and knobs as :class:`IRCoT`'s (route C), and two knobs more: ``single_k`` and ``classifier``.

    Example:
        >>> from ragsuite import programs
        >>> sorted(programs.get("adaptive-rag").default_knobs())
        ['classifier', 'max_passages', 'max_steps', 'reader', 'single_k', 'top_k']
    """

    name: ClassVar[str] = "adaptive-rag"
    KNOBS: ClassVar[Knobs] = IRCoT.KNOBS + Knobs(
        integer(
            "single_k",
            15,
            minimum=1,
            search=OneOf((5, 10, 15)),
            help="passages the single-step route B reads (the authors' 15 in their Flan-T5 runs)",
        ),
        path(
            "classifier",
            help="directory of a trained complexity classifier (`ragsuite classifier train`), which routes "
            "without an LM call; null: the LM classifies",
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        # Loaded once here, so a missing or corrupt classifier fails before any question runs.
        self._trained = None if self.classifier is None else load_classifier(self.classifier)
        self.classify = dspy.Predict(QueryComplexity)
        self.direct = dspy.Predict(answer_signature(task, "none"))

    def artifacts(self) -> dict[str, str]:
        """The trained classifier's content hash: retrained in place, it is another configuration."""
        return {} if self._trained is None else {"classifier": str(self._trained.sha256)}

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        if self._trained is not None:
            probabilities = self._trained.predict_proba(question)
            complexity = self._trained.predict(question)
            ledger.record(
                "route",
                complexity=complexity,
                classifier="trained",
                probabilities={label: round(p, 4) for label, p in probabilities.items()},
            )
        else:
            classified = await self.acall_stage(
                ledger,
                "classify",
                _salvage_complexity(self.classify),
                fallback={"complexity": COMPLEXITY_FALLBACK},
                question=question,
            )
            complexity = (
                classified.complexity if classified.complexity in ("A", "B", "C") else COMPLEXITY_FALLBACK
            )
            ledger.record(
                "route", complexity=complexity, **({"salvaged": True} if classified.get("salvaged") else {})
            )
        if complexity == "A":
            if self.reader == "cot":
                answer = await self.aread(ledger, question, [], source="none")
            else:
                answer = await arun_answer(
                    self, ledger, source="none", predictor=self.direct, question=question
                )
            return self.finish(ledger, answer, [], route=complexity)
        if complexity == "B":
            # The authors' single-step run reads its own number of passages (their "oner" configuration).
            passages = await aretrieve_recorded(self, ledger, reasoning_query(question, []), self.single_k)
            ledger.count_step()
        else:
            passages, _ = await ainterleave_reasoning(
                self,
                ledger,
                question,
                self.next_thought,
                top_k=self.top_k,
                max_steps=self.max_steps,
                max_passages=self.max_passages,
            )
        answer = await self.aread(ledger, question, passages)
        return self.finish(ledger, answer, passages, route=complexity)


@register
class AdaptiveRetrieval(RAGProgram):
    """Adaptive Retrieval (Mallen et al., 2023, "When Not to Trust Language Models"): retrieve only when the
    LM's own knowledge is not enough, else answer without retrieval.

    The paper decides by the popularity of the question's entity (Wikipedia page views below a threshold
    mean retrieve), a resource ragsuite does not ship. The closest faithful variant here asks the LM whether
    it can answer reliably from its own knowledge (``RetrievalNeed``), which is what popularity stands in
    for; an unparsable reply retrieves (recorded). With retrieval it answers from the top ``top_k`` passages.

    Stage predictors: ``decide``, ``direct``, ``answer``.

    Example:
        >>> from ragsuite import programs
        >>> programs.get("adaptive-retrieval").default_knobs()
        {'top_k': 5}
    """

    name: ClassVar[str] = "adaptive-retrieval"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 5, minimum=1, search=OneOf((3, 5, 7, 10)), help="passages read when it retrieves"),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.decide = dspy.Predict(RetrievalNeed)
        self.direct = dspy.Predict(answer_signature(task, "none"))
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        decided = await self.acall_stage(
            ledger, "decide", self.decide, fallback={"needs_retrieval": True}, question=question
        )
        retrieve = decided.needs_retrieval is not False
        ledger.record("decide", retrieve=retrieve)
        if not retrieve:
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages)


__all__ = [
    "ANSWER_IS",
    "AdaptiveRAG",
    "AdaptiveRetrieval",
    "IRCoT",
    "ainterleave_reasoning",
    "extract_answer",
    "first_sentence",
    "is_reasoning_sentence",
    "reasoning_query",
]
