"""FLARE (Jiang et al., 2023, "Active Retrieval Augmented Generation"; the authors' code,
github.com/jzbjyb/FLARE, ``src/openai_api.py`` and ``configs/2wikihop_flare_config.json``): FLARE-instruct, a
baseline of DeepNote's Table 1, and FLARE-direct, which decides by token probabilities.

FLARE-instruct (:class:`FlareInstruct`). FLARE retrieves ``top_k`` passages for the input (the question)
before generating. Generation proceeds sentence by sentence: the LM writes the next sentence from the passages
in hand and, when it is not confident about a fact the sentence needs, a search query (``LookAhead``; the
paper's ``[Search(query)]``). With a query, ``top_k`` passages are retrieved for it and replace those in hand
(the authors' ``ctx_increase="replace"``), and the sentence is written again from them; without one, the
sentence is kept. Passages stay in hand for every later sentence until the next search. One LM call per
sentence, one more per search. It stops when a sentence says "answer is" or after ``max_steps`` sentences;
the final answer, in the task's style, is read from the generated text.

FLARE-direct (:class:`FlareDirect`). The question is the first query (the authors'
``look_ahead_pre_retrieval="first"``). For each next sentence the LM writes a look-ahead from the passages in
hand, returning the log probability of every token; the look-ahead is cut to its first sentence (of at least
5 characters, the authors' ``look_ahead_truncate_at_boundary="sentence"``) and only that sentence's tokens are
judged. When any of them has probability at most ``theta``, the sentence is not trusted: the tokens at most
``beta`` are masked out of it (each replaced by a space, the rest joined and stripped: the authors'
``mask_method="simple"``), the rest is the query, ``top_k`` passages replace those in hand and the sentence is
written again from them (and cut to its first sentence). A confident sentence is kept as it is; a sentence
whose every token is masked leaves an empty query, and, as in the original, nothing is retrieved and the
sentence is kept. Stopping and the final answer are as in FLARE-instruct. Defaults follow the authors'
2WikiMultihopQA configuration: ``theta`` 0.8, ``beta`` 0.4, two passages per retrieval.

FLARE-direct needs an LM that returns log probabilities (OpenAI chat models, vLLM); with one that does not,
it stops with an error naming ``flare-instruct``, the variant for such LMs.

Differences from the original:

* Output fields. The paper continues raw few-shot text; here the LM writes each sentence as a DSPy output
  field, so FLARE-direct judges the probabilities of the tokens spelling the field's value
  (:func:`field_token_probs`); a sentence whose tokens cannot be matched in the reply is not trusted and is
  searched for whole. Why: every program here runs on any DSPy LM.
* Stopping. The original generates until a blank line ("\\n\\n") or 256 tokens; ragsuite stops after a
  sentence saying "answer is" (how the authors' 2WikiMultihopQA exemplars end) or ``max_steps`` sentences.
  Why: a sentence-per-call loop needs a sentence budget.
* A confident look-ahead (FLARE-direct) or a sentence written without a search (FLARE-instruct) is kept;
  the original asks for it again with the same passages. Why: at the authors' temperature 0 the second
  call returns the same text; ragsuite saves the call.
* FLARE-instruct's granularity. The original writes until the LM emits ``[Search(query)]`` (possibly
  mid-sentence, keeping the text before it) and then continues; ragsuite writes whole sentences, each with
  an optional query, and rewrites the sentence after a search. The second call's query is ignored (the
  original forbids a search in the tokens right after one). Why: sentence-level DSPy fields.
* The answer. The authors read the answer off the generated text (what follows "answer is" on
  2WikiMultihopQA); ragsuite asks the task's reader for it from the generated text, one more LM call.
  Why: the answer takes the task's answer style (short, yes/no, long) as every program's does.
* Sentence boundaries come from :func:`ragsuite.programs.ircot.first_sentence` rather than NLTK's Punkt.
  Why: no tokenizer download.
* Queries other than the question are not cut to 64 tokens (the authors' ``max_query_length``). Why: a
  sentence is far shorter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import dspy

from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.ircot import ANSWER_IS, first_sentence
from ragsuite.programs.knobs import Floats, Ints, Knobs, integer, probability
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer, merge_passages
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.reasoning import LookAhead, NextSentence


@register
class FlareInstruct(RAGProgram):
    """FLARE-instruct: look ahead one sentence at a time, retrieve when the LM asks, regenerate from what was
    found (see the module docstring).

    Stage predictors: ``look_ahead`` (both the look-ahead and the regenerated sentence), ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``max_steps=5``).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("flare-instruct").default_knobs()
        {'top_k': 3, 'max_steps': 5}
    """

    name: ClassVar[str] = "flare-instruct"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 3, minimum=1, search=Ints(1, 7), help="passages per retrieval (ours: 3)"),
        integer("max_steps", 5, minimum=1, search=Ints(2, 8), help="most sentences (ours: 5)"),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.look_ahead = dspy.Predict(LookAhead)
        self.answer = dspy.Predict(answer_signature(task, "note"))

    async def _sentence(
        self, ledger: Any, question: str, passages: list[Any], sentences: list[str]
    ) -> dspy.Prediction:
        return await self.acall_stage(
            ledger,
            "look_ahead",
            self.look_ahead,
            fallback={"search_query": "", "sentence": ""},
            question=question,
            passages=format_passages(passages),
            answer_so_far=" ".join(sentences) or "nothing yet",
        )

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        sentences: list[str] = []
        # FLARE's first query is the input itself; what it finds is in hand for the first sentence.
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        evidence = [passages]
        reason = "max_steps"
        for step in range(1, self.max_steps + 1):
            ahead = await self._sentence(ledger, question, passages, sentences)
            query = " ".join(str(ahead.search_query or "").split())
            sentence = " ".join(str(ahead.sentence or "").split())
            retrieved: list[Passage] = []
            if query:
                retrieved = await self.aretrieve(ledger, query, self.top_k)
                ledger.count_step()
                evidence.append(retrieved)
                passages = retrieved  # the authors' ctx_increase="replace"
                again = await self._sentence(ledger, question, passages, sentences)
                sentence = " ".join(str(again.sentence or "").split()) or sentence
            ledger.record(
                "sentence", step=step, query=query, passage_ids=[p.id for p in retrieved], sentence=sentence
            )
            if not sentence:
                reason = "no_sentence"
                break
            sentences.append(sentence)
            if ANSWER_IS.search(sentence):
                reason = "answer"
                break
        return await _answer_from_sentences(self, ledger, question, sentences, evidence, reason)


async def _answer_from_sentences(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    sentences: list[str],
    evidence: list[list[Passage]],
    reason: str,
) -> dspy.Prediction:
    """Both variants' ending: the reader answers from the generated sentences; evidence is what was read."""
    ledger.record("stop", reason=reason, sentences=len(sentences))
    text = " ".join(sentences) or "nothing"
    answer = await arun_answer(program, ledger, source="note", question=question, note=text)
    return program.finish(ledger, answer, merge_passages(evidence), generated=text)


def _entries(logprobs: Any) -> list[tuple[str, float]]:
    """``(token, logprob)`` pairs of an OpenAI-format ``logprobs`` value (``{"content": [...]}``)."""
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else getattr(logprobs, "content", None)
    pairs = []
    for entry in content or []:
        token = entry.get("token") if isinstance(entry, Mapping) else getattr(entry, "token", None)
        logprob = entry.get("logprob") if isinstance(entry, Mapping) else getattr(entry, "logprob", None)
        if isinstance(token, str) and isinstance(logprob, (int, float)):
            pairs.append((token, float(logprob)))
    return pairs


def field_token_probs(logprobs: Any, value: str, *, field: str) -> list[tuple[str, float]] | None:
    """The tokens that spell ``value`` in an LM reply, each with its probability.

    The reply's tokens concatenate to its text; ``value`` (a parsed output field) is found after the field's
    ``[[ ## field ## ]]`` header (ChatAdapter) or, failing that, anywhere in the text (JSONAdapter). Tokens
    straddling the value's edges contribute only the characters inside it. None when the value is not found.

    Example:
        >>> field_token_probs({"content": [{"token": "Hi", "logprob": 0.0}]}, "Hi", field="x")
        [('Hi', 1.0)]
    """
    pairs = _entries(logprobs)
    text = "".join(token for token, _ in pairs)
    header = f"[[ ## {field} ## ]]"
    after = text.rfind(header)
    start = text.find(value, after + len(header)) if after >= 0 else -1
    if start < 0:
        start = text.rfind(value)
    if start < 0 or not value:
        return None
    end = start + len(value)
    found, offset = [], 0
    for token, logprob in pairs:
        lo, hi = offset, offset + len(token)
        offset = hi
        if hi > start and lo < end:
            found.append((token[max(start - lo, 0) : min(end, hi) - lo], math.exp(logprob)))
    return found


def masked_query(tokens: list[tuple[str, float]], beta: float) -> str:
    """FLARE's implicit query: the sentence with every token of probability at most ``beta`` replaced by a
    space, stripped (the authors' ``use_as_query`` with ``mask_method="simple"``)."""
    return "".join(token if prob > beta else " " for token, prob in tokens).strip()


def first_sentence_tokens(tokens: list[tuple[str, float]], length: int) -> list[tuple[str, float]]:
    """The tokens of the first ``length`` characters of the text they spell (a token straddling the end is
    kept whole, as the authors' ``truncate_at_boundary`` keeps every token starting before the cut)."""
    kept, offset = [], 0
    for token, prob in tokens:
        if offset >= length:
            break
        kept.append((token, prob))
        offset += len(token)
    return kept


@register
class FlareDirect(RAGProgram):
    """FLARE-direct: look ahead one sentence at a time and retrieve, with the unsure tokens masked out of the
    query, when any token's probability is below ``theta`` (see the module docstring). Needs an LM that
    returns log probabilities; use ``flare-instruct`` otherwise.

    Stage predictors: ``look_ahead`` (both the look-ahead and the regenerated sentence), ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``theta=0.8``).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("flare-direct").default_knobs()
        {'top_k': 2, 'max_steps': 5, 'theta': 0.8, 'beta': 0.4}
    """

    name: ClassVar[str] = "flare-direct"
    NEEDS_LOGPROBS: ClassVar[bool] = True
    KNOBS: ClassVar[Knobs] = FlareInstruct.KNOBS.override(top_k=2).replace(
        "top_k", help="passages per retrieval (the authors' 2WikiMultihopQA setting: 2)"
    ) + Knobs(
        probability(
            "theta",
            0.8,
            search=Floats(0.1, 0.99),
            help="retrieve when any token of the look-ahead sentence has probability at most this",
        ),
        probability(
            "beta",
            0.4,
            search=Floats(0.0, 0.9),
            help="mask the tokens of probability at most this out of the query",
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.look_ahead = dspy.Predict(NextSentence)
        self.answer = dspy.Predict(answer_signature(task, "note"))

    async def _sentence(
        self, ledger: Any, question: str, passages: list[Passage], sentences: list[str], *, scored: bool
    ) -> dspy.Prediction:
        extra = {"config": {"logprobs": True}} if scored else {}
        return await self.acall_stage(
            ledger,
            "look_ahead",
            self.look_ahead,
            fallback={"sentence": ""},
            question=question,
            passages=format_passages(passages),
            answer_so_far=" ".join(sentences) or "nothing yet",
            **extra,
        )

    def _token_probs(self, ahead: dspy.Prediction, sentence: str) -> list[tuple[str, float]] | None:
        logprobs = ahead.get("logprobs") if hasattr(ahead, "get") else None
        if not logprobs or not _entries(logprobs):
            raise ConfigError(
                "flare-direct needs an LM that returns log probabilities (OpenAI chat models, vLLM), and "
                "this LM returned none; run flare-instruct instead, FLARE's variant for such LMs"
            )
        return field_token_probs(logprobs, sentence, field="sentence")

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        sentences: list[str] = []
        # FLARE's first query is the input itself.
        passages = await self.aretrieve(ledger, question, self.top_k)
        ledger.count_step()
        ledger.record("retrieve", query=question, passage_ids=[p.id for p in passages])
        evidence = [passages]
        reason = "max_steps"
        for step in range(1, self.max_steps + 1):
            ahead = await self._sentence(ledger, question, passages, sentences, scored=True)
            reply = str(ahead.sentence or "").strip()
            tokens = self._token_probs(ahead, reply) if reply else None
            # The look-ahead is judged on its first sentence only (the authors' truncate_at_boundary).
            sentence = first_sentence(reply, min_chars=5)
            if not sentence:
                ledger.record("sentence", step=step, sentence="")
                reason = "no_sentence"
                break
            if tokens is not None:
                tokens = first_sentence_tokens(tokens, len(sentence))
            query, masked, lowest = "", [], None
            if tokens is None:  # the tokens could not be matched to the sentence: trust nothing
                low = True
                query = " ".join(sentence.split())
            else:
                lowest = min((p for _, p in tokens), default=1.0)
                low = any(p <= self.theta for _, p in tokens)
                if low:
                    query = masked_query(tokens, self.beta)
                    masked = [t.strip() for t, p in tokens if p <= self.beta and t.strip()]
            retrieved = bool(query)  # an all-masked sentence leaves no query: nothing is retrieved
            if retrieved:
                passages = await self.aretrieve(ledger, query, self.top_k)
                ledger.count_step()
                evidence.append(passages)
                again = await self._sentence(ledger, question, passages, sentences, scored=False)
                sentence = first_sentence(str(again.sentence or "").strip(), min_chars=5) or sentence
            ledger.record(
                "sentence",
                step=step,
                min_prob=None if lowest is None else round(lowest, 4),
                retrieved=retrieved,
                query=query,
                masked=masked,
                passage_ids=[p.id for p in passages] if retrieved else [],
                sentence=sentence,
                **({"all_masked": True} if low and not retrieved else {}),
                **(
                    {"cut": reply[len(sentence) :].strip()}
                    if len(reply) > len(sentence) and not retrieved
                    else {}
                ),
            )
            sentences.append(" ".join(sentence.split()))
            if ANSWER_IS.search(sentence):
                reason = "answer"
                break
        return await _answer_from_sentences(self, ledger, question, sentences, evidence, reason)


__all__ = ["FlareDirect", "FlareInstruct", "field_token_probs", "first_sentence_tokens", "masked_query"]
