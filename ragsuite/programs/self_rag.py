"""Self-RAG (Asai et al., 2024, "Self-RAG"; the authors' code, github.com/AkariAsai/self-rag,
``retrieval_lm/run_short_form.py``), a baseline of DeepNote's and HANRAG's tables: read from a Self-RAG
checkpoint (``self-rag``), or prompted (``self-rag-prompted``) for any other LM.

Self-RAG is a model trained to emit reflection tokens: [Retrieve] (is retrieval needed?), then for each
retrieved passage a candidate segment with [IsREL] (is the passage relevant?), [IsSUP] (is the segment
supported: fully, partially, not at all) and [IsUSE] (usefulness, 1-5); the candidates are ranked by a
weighted sum of the critique scores and the best is kept.

``self-rag`` (:class:`SelfRAG`) reads the reflection tokens from the token probabilities of a Self-RAG
checkpoint served by vLLM, scoring as the authors' short-form inference does (see its docstring).

``self-rag-prompted`` (:class:`SelfRAGPrompted`) asks any LM to state them:

1. ``RetrievalNeed`` stands for [Retrieve]: without retrieval the LM answers from its own knowledge.
2. With retrieval, ``top_k`` passages are retrieved and, for each, ``CritiquedAnswer`` writes an answer and
   its three critiques (one call per passage, run concurrently).
3. Each candidate scores ``w_rel * IsREL + w_sup * IsSUP + w_use * IsUSE``, with IsREL 1 / 0, IsSUP 1 / 0.5 /
   0 and IsUSE 1-5 mapped to -1, -0.5, 0, 0.5, 1 (the authors' expectation scale for [Utility:1-5]; the
   paper's inference weights are 1.0, 1.0 and 0.5); the best candidate's answer, in the task's style, is the
   answer. Ties keep the retrieval order; an unparsable critique scores 0 (no critique tokens: every score 0,
   as in the original when a token is missing).

Differences from the original:

* ``self-rag-prompted`` is ragsuite's: the LM states the critiques as DSPy output fields (IsREL and IsSUP as
  words, IsUSE as a number) instead of reflection-token probabilities, and a reader writes the answer from
  the best candidate in the task's style. Why: the paper's method needs a Self-RAG checkpoint; the prompted
  variant keeps its decision and ranking for any LM.
* The retrieval decision (``self-rag``). The paper retrieves when the normalised probability of
  [Retrieval] exceeds the threshold; the authors' ``run_short_form.py`` divides the two tokens' *log*
  probabilities instead (which inverts the decision: a confident [Retrieval] gives a small ratio).
  ragsuite follows the paper. Why: the code's ratio is a bug the paper's definition does not have.
* ``w_use`` (``self-rag``). The paper and the README's long-form defaults use 0.5; ``run_short_form.py``'s
  default, which the README's short-form commands do not override, is 1.0. ragsuite uses 0.5 everywhere.
  Why: one documented weight; set ``w_use=1.0`` for the authors' short-form runs.
* Alternatives per token (``self-rag``). The authors ask vLLM for 5000 alternatives per position (32016 for
  the first token); ragsuite asks for 20 (vLLM's default ceiling, ``--max-logprobs``), so a reflection token
  outside the top 20 gets the original's missing-token log probability -100. When neither [Retrieval] nor
  [No Retrieval] is among the alternatives, both get -100 and the retrieval probability is 0.5, whatever
  token the checkpoint wrote: above the default threshold 0.2, it retrieves, as the original's ratio of two
  -100s (0.5) would (the original sets -100 for a missing token; with the whole vocabulary asked for at the
  first token, it never misses one). Why: a stock vLLM server refuses more.
* The decision call (``self-rag``) asks for 1 token; the original generates a whole answer first and uses
  only its first token's probabilities unless it does not retrieve, when it generates again after
  "[No Retrieval]". Why: the same decision for one token; the answer comes from the second call in both.
* Answers of open tasks (``self-rag``). The original returns the best candidate's raw text, reflection
  tokens included, and scores it by substring match; ragsuite removes them as the original does for closed
  tasks and for answers without retrieval. Why: EM and F1 would count the tokens as words.
* ``top_k`` defaults to 5 (the authors' ARC, PubHealth and ASQA commands); their PopQA/TriviaQA command
  uses 10 (``--ndocs 10``).
* Long-form generation (``self-rag``, ``task="long"``; ``run_long_form_static.py``). (a) The authors'
  script computes the utility score from the [IsSUP] tokens' probabilities (it loops over the wrong token
  group), so utility is always 0 there; ragsuite scores utility as the paper and the short-form script do.
  (b) It never passes ``use_seqscore`` to the segment scoring; ragsuite adds the sequence probability when
  ``use_seqscore`` is on, as the paper's segment score does. (c) Within one parent, each child after the
  first is prompted with the previous sibling's segment instead of the parent's text; ragsuite prompts every
  child with its parent's text. (d) A missing [IsREL] token counts as probability -100 there (a log
  probability used as a probability); ragsuite uses exp(-100) as everywhere else. (e) The README's ASQA
  command retrieves always (``--mode always_retrieve``); ragsuite decides with ``threshold`` (set it to 0
  to always retrieve). (f) The authors' ASQA output cites each segment's passage ("[i]") and drops each
  segment's last character before the citation; ragsuite joins the segments as written, uncited, and
  returns the cited passages as the evidence. Why (a)-(d): bugs the paper's description does not have;
  (e): one decision rule for every task; (f): ragsuite scores the answer text, not citations.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import dspy
from dspy.utils.callback import with_callbacks

from ragsuite.aio import concurrently
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError
from ragsuite.lm_client import DEFAULT_MAX_RETRY_WAIT, retry_wait
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.knobs import Floats, Ints, Knobs, OneOf, flag, integer, number, probability
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer, check_int, merge_passages
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature
from ragsuite.signatures.reasoning import CritiquedAnswer, RetrievalNeed

_SUPPORT = {"fully": 1.0, "partially": 0.5, "no": 0.0}
#: IsUSE 1-5 on the authors' expectation scale for [Utility:1] ... [Utility:5].
_USEFULNESS = {1: -1.0, 2: -0.5, 3: 0.0, 4: 0.5, 5: 1.0}
#: An unparsable critique: no critique at all, so every score is 0 (usefulness None is unrated, not 1).
CRITIQUE_FALLBACK: dict[str, Any] = {"answer": "", "relevant": None, "supported": None, "usefulness": None}


#: The knobs both Self-RAG programs share: passages, and the critique weights (the paper's 1.0, 1.0, 0.5).
SHARED_KNOBS = Knobs(
    integer(
        "top_k", 5, minimum=1, search=Ints(2, 8), help="passages retrieved, one candidate each (paper: 5)"
    ),
    *(
        number(name, default, minimum=0.0, search=Floats(0.0, 2.0), help=f"the {critique} critique's weight")
        for name, default, critique in (
            ("w_rel", 1.0, "IsREL (relevance)"),
            ("w_sup", 1.0, "IsSUP (support)"),
            ("w_use", 0.5, "IsUSE (usefulness)"),
        )
    ),
)


@register
class SelfRAGPrompted(RAGProgram):
    """Self-RAG's decide-retrieve-critique-select loop with prompted reflection (see the module docstring).

    Stage predictors: ``decide``, ``critique``, ``direct``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``top_k=5``).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("self-rag-prompted").default_knobs()
        {'top_k': 5, 'w_rel': 1.0, 'w_sup': 1.0, 'w_use': 0.5}
    """

    name: ClassVar[str] = "self-rag-prompted"
    KNOBS: ClassVar[Knobs] = SHARED_KNOBS

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.decide = dspy.Predict(RetrievalNeed)
        self.critique = dspy.Predict(CritiquedAnswer)
        self.direct = dspy.Predict(answer_signature(task, "none"))
        self.answer = dspy.Predict(answer_signature(task, "note"))

    def score(self, critique: Any) -> float:
        """The weighted critique score of one candidate (IsUSE on the -1..1 scale; unrated: 0)."""
        try:
            use = _USEFULNESS[min(max(int(critique.usefulness), 1), 5)]
        except (TypeError, ValueError):
            use = 0.0
        relevant = 1.0 if critique.relevant is True else 0.0
        return (
            self.w_rel * relevant + self.w_sup * _SUPPORT.get(str(critique.supported), 0.0) + self.w_use * use
        )

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        decided = await self.acall_stage(
            ledger, "decide", self.decide, fallback={"needs_retrieval": True}, question=question
        )
        if decided.needs_retrieval is False:
            ledger.record("decide", retrieve=False)
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        ledger.record("decide", retrieve=True)
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        critiques = await concurrently(
            lambda p: self.acall_stage(
                ledger,
                "critique",
                self.critique,
                fallback=CRITIQUE_FALLBACK,
                question=question,
                passage=p.render(),
            ),
            passages,
        )
        scores = [self.score(c) for c in critiques]
        for passage, critique, score in zip(passages, critiques, scores, strict=True):
            ledger.record(
                "critique",
                passage_id=passage.id,
                candidate=str(critique.answer or ""),
                relevant=critique.relevant is True,
                supported=str(critique.supported),
                usefulness=critique.usefulness,
                score=round(score, 4),
            )
        if not passages:
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        best = max(range(len(passages)), key=lambda i: (scores[i], -i))
        note = f"{passages[best].render()}\nCandidate answer: {critiques[best].answer or ''}"
        answer = await arun_answer(self, ledger, source="note", question=question, note=note)
        return self.finish(
            ledger, answer, [passages[best]], candidates=[str(c.answer or "") for c in critiques]
        )


# --------------------------------------------------------------------------- Self-RAG read from a checkpoint
#: Self-RAG's reflection tokens, as its checkpoints' vocabularies spell them.
RETRIEVE_TOKENS = ("[Retrieval]", "[No Retrieval]")
RELEVANCE_TOKENS = ("[Relevant]", "[Irrelevant]")
SUPPORT_TOKENS = ("[Fully supported]", "[Partially supported]", "[No support / Contradictory]")
UTILITY_TOKENS = tuple(f"[Utility:{i}]" for i in range(1, 6))
#: What is removed from a generation to leave its answer: the authors' ``control_tokens``, then "</s>",
#: "\\n" and "<|endoftext|>" (``postprocess_answer_option_conditioned``). "[Continue to Use Evidence]" is
#: not on their list and stays in the text, as in the original.
CONTROL_TOKENS = (
    *SUPPORT_TOKENS,
    *RETRIEVE_TOKENS,
    *RELEVANCE_TOKENS,
    "<paragraph>",
    "</paragraph>",
    *UTILITY_TOKENS,
    "</s>",
    "\n",
    "<|endoftext|>",
)
#: The log probability the official scoring gives a reflection token missing from a position's alternatives.
MISSING_LOGPROB = -100.0
#: Alternatives asked per generated token (vLLM's default ceiling, ``--max-logprobs 20``).
TOP_LOGPROBS = 20
_UTILITY_VALUES = (-1.0, -0.5, 0.0, 0.5, 1.0)
_INSTRUCTIONS = {
    # Self-RAG's QA prompt is the bare question; the other two say what kind of answer is wanted.
    "short": "{question}",
    "yesno": "Answer the question with yes or no.\n\n## Input:\n\n{question}",
    "long": (
        "Answer the following question. The question may be ambiguous and have several correct answers; "
        "then write a long answer that covers all of them.\n\n## Input:\n\n{question}"
    ),
}


def self_rag_prompt(question: str, task: Task = "short") -> str:
    """Self-RAG's instruction prompt for ``question`` (its ``prompt_no_input`` format)."""
    return f"### Instruction:\n{_INSTRUCTIONS[task].format(question=question)}\n\n### Response:\n"


def paragraph(passage: Any) -> str:
    """A passage as Self-RAG reads it after the prompt: ``[Retrieval]<paragraph>title\\ntext</paragraph>``."""
    return f"[Retrieval]<paragraph>{passage.title}\n{passage.text}</paragraph>"


def strip_control_tokens(text: str) -> str:
    """The authors' ``postprocess_answer_option_conditioned``: :data:`CONTROL_TOKENS` removed, nothing else
    (the key under which closed tasks sum their candidates' scores)."""
    for token in CONTROL_TOKENS:
        text = text.replace(token, "")
    return text


def clean_generation(text: str) -> str:
    """A generation as the authors post-process an answer: the control tokens and newlines removed (lines
    joined with nothing between them, as theirs are), then one leading "#" or ":" dropped; surrounding
    spaces are stripped.

    Example:
        >>> clean_generation("[Relevant]: Paris\\nFrance[Fully supported][Utility:5]</s>")
        'ParisFrance'
    """
    text = strip_control_tokens(text)
    if text[:1] in ("#", ":"):
        text = text[1:]
    return text.strip()


@dataclass(frozen=True)
class Generation:
    """One completion from the checkpoint: its text and, per generated token, the token, its log
    probability and the alternatives the server reported (token -> log probability)."""

    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[str, float], ...]

    def distribution(self, position: int, names: tuple[str, ...]) -> dict[str, float]:
        """Probabilities of ``names`` at ``position`` (a missing name gets ``exp(-100)``, as officially)."""
        alternatives: dict[str, float] = {}
        for token, logprob in (self.top[position] if position < len(self.top) else {}).items():
            key = token.strip()  # a tokenizer may report a special token with the space before it
            alternatives[key] = max(logprob, alternatives.get(key, MISSING_LOGPROB))
        return {name: math.exp(alternatives.get(name, MISSING_LOGPROB)) for name in names}

    def first(self, names: tuple[str, ...]) -> int | None:
        """The first position where the generated token is one of ``names``."""
        return next((i for i, token in enumerate(self.tokens) if token.strip() in names), None)


def reflection_scores(generation: Generation) -> dict[str, float]:
    """Self-RAG's critique scores of one candidate, read from its token probabilities as the official
    short-form inference does:

    * ``relevance``: P([Relevant]) / (P([Relevant]) + P([Irrelevant])) at the first generated token;
    * ``support``: at the first [IsSUP] token, (P(fully) + 0.5 P(partially)) / the three's sum; else 0;
    * ``utility``: at the first [Utility:i] token, the expectation of -1, -0.5, 0, 0.5, 1 over the five
      levels' normalized probabilities; 0 without one;
    * ``sequence``: exp of the mean token log probability of the generation.
    """
    relevance = generation.distribution(0, RELEVANCE_TOKENS)
    scores = {"relevance": relevance["[Relevant]"] / sum(relevance.values())}
    position = generation.first(SUPPORT_TOKENS)
    if position is None:
        scores["support"] = 0.0
    else:
        support = generation.distribution(position, SUPPORT_TOKENS)
        total = sum(support.values())
        scores["support"] = (support["[Fully supported]"] + 0.5 * support["[Partially supported]"]) / total
    position = generation.first(UTILITY_TOKENS)
    if position is None:
        scores["utility"] = 0.0
    else:
        utility = generation.distribution(position, UTILITY_TOKENS)
        total = sum(utility.values())
        scores["utility"] = sum(
            v * utility[t] / total for v, t in zip(_UTILITY_VALUES, UTILITY_TOKENS, strict=True)
        )
    count = max(len(generation.logprobs), 1)
    scores["sequence"] = math.exp(sum(generation.logprobs) / count)
    return scores


class CheckpointClient:
    """Completions with log probabilities from a Self-RAG checkpoint behind an OpenAI-compatible
    ``/v1/completions`` endpoint (vLLM), addressed like the ``dspy.LM`` in use (model, ``api_base``, key).

    Self-RAG needs the raw prompt (``dspy.LM``'s text mode rewrites it) and its reflection tokens left in the
    text (``skip_special_tokens: false``, a vLLM option). Usage goes to DSPy's usage tracker when one is on.

    Failed requests are retried like every other LM call: connection errors, timeouts, 429 and 5xx, up to the
    LM's ``num_retries`` times, each wait the server's ``Retry-After`` or exponential backoff, capped at the
    LM's ``max_retry_wait`` and logged (:func:`ragsuite.lm_client.retry_wait`); other errors (400, 401, 404)
    are raised at once, and so is the last attempt's error.
    """

    def __init__(self, lm: Any) -> None:
        kwargs = dict(getattr(lm, "kwargs", {}) or {})
        model = str(getattr(lm, "model", "") or "")
        provider, _, name = model.partition("/")
        if not kwargs.get("api_base") or provider not in ("openai", "hosted_vllm") or not name:
            raise ConfigError(
                "self-rag reads reflection tokens from a Self-RAG checkpoint served by vLLM: pass --lm "
                "openai/<served model> --api-base http://HOST:PORT/v1 (e.g. selfrag/selfrag_llama2_7b under "
                f"`vllm serve`), not {model or type(lm).__name__!r}; any other LM runs self-rag-prompted"
            )
        import openai

        self.lm = lm
        self.lm_name = model
        self.model = name
        self.retries = max(int(getattr(lm, "num_retries", 2) or 0), 0)
        cap = getattr(lm, "max_retry_wait", None)
        self.max_retry_wait = DEFAULT_MAX_RETRY_WAIT if cap is None else float(cap)
        # The openai client's own retries would wait as long as Retry-After says, silently: ours are capped.
        self._client = openai.OpenAI(
            base_url=kwargs["api_base"],
            api_key=kwargs.get("api_key") or "EMPTY",
            timeout=float(kwargs.get("timeout") or 120.0),
            max_retries=0,
            default_headers=kwargs.get("extra_headers"),
        )

    def close(self) -> None:
        self._client.close()

    def __call__(self, *, prompt: str, max_tokens: int) -> Generation:
        # Reported to DSPy's callbacks as a call of the dspy.LM in use, so that eval counts it as an LM
        # invocation and MLflow traces it like every other LM call.
        return _as_lm_call(self.lm, self, prompt=prompt, max_tokens=max_tokens)

    def _create(self, **request: Any) -> Any:
        """``completions.create(**request)``, retried as described in the class docstring."""
        for attempt in range(self.retries + 1):
            try:
                return self._client.completions.create(**request)
            except Exception as exc:
                if attempt >= self.retries or not _retryable(exc):
                    raise
                response = getattr(exc, "response", None)
                asked = response.headers.get("retry-after") if response is not None else None
                time.sleep(retry_wait(exc, attempt, cap=self.max_retry_wait, retry_after=asked))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _complete(self, *, prompt: str, max_tokens: int) -> Generation:
        reply = self._create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            top_p=1.0,
            logprobs=TOP_LOGPROBS,
            extra_body={"skip_special_tokens": False},
        )
        if reply.usage is not None and dspy.settings.usage_tracker is not None:
            dspy.settings.usage_tracker.add_usage(
                self.lm_name,
                {
                    "prompt_tokens": reply.usage.prompt_tokens,
                    "completion_tokens": reply.usage.completion_tokens,
                    "total_tokens": reply.usage.total_tokens,
                },
            )
        choice = reply.choices[0]
        logprobs = choice.logprobs
        if logprobs is None or not logprobs.tokens:
            raise ConfigError(
                f"the server gave no log probabilities for {self.model!r}; self-rag needs a Self-RAG "
                "checkpoint served by vLLM (which returns them); any other LM runs self-rag-prompted"
            )
        return Generation(
            text=choice.text or "",
            tokens=tuple(logprobs.tokens),
            logprobs=tuple(
                float(lp) if lp is not None else MISSING_LOGPROB for lp in logprobs.token_logprobs
            ),
            top=tuple(dict(top or {}) for top in (logprobs.top_logprobs or [{}] * len(logprobs.tokens))),
        )


def _retryable(exc: BaseException) -> bool:
    """Whether a failed completion is worth retrying: connection errors and timeouts, 429 and 5xx."""
    import openai

    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError included
        return True
    return isinstance(exc, openai.APIStatusError) and (exc.status_code == 429 or exc.status_code >= 500)


@with_callbacks
def _as_lm_call(instance: Any, client: CheckpointClient, *, prompt: str, max_tokens: int) -> Generation:
    """``client``'s completion, seen by DSPy's callbacks as a call of ``instance`` (the dspy.LM in use)."""
    return client._complete(prompt=prompt, max_tokens=max_tokens)


def long_form_text(text: str) -> str:
    """A long-form segment as the authors post-process it (``utils.postprocess``, then ``fix_spacing``):
    reflection tokens and "</s>" removed, one leading space dropped, a space put after a sentence end that
    lacks one. Newlines stay.

    Example:
        >>> long_form_text(" Paris is big.It is old.[Fully supported][Utility:5]</s>")
        'Paris is big. It is old.'
    """
    for token in (*SUPPORT_TOKENS, *RETRIEVE_TOKENS[:2], *RELEVANCE_TOKENS, "<paragraph>", "</paragraph>"):
        text = text.replace(token, "")
    for token in (*UTILITY_TOKENS, "</s>"):
        text = text.replace(token, "")
    if text.startswith(" "):
        text = text[1:]
    return re.sub(r"(?<=\w)([.!?])(?=\w)", r"\1 ", text)


def _remap_no_retrieval(generation: Generation, threshold: float) -> str:
    """The authors' long-form re-reading of a segment's "[No Retrieval]" tokens: each becomes "[Retrieval]"
    where (P([Retrieval]) + P([Continue to Use Evidence])) / (P([Retrieval]) + P([No Retrieval])) at its
    position is above ``threshold`` (``run_step_generation_batch``; a marker is appended after the last
    piece, as there)."""
    text = generation.text
    if "[No Retrieval]" not in text:
        return text
    names = (*RETRIEVE_TOKENS, "[Continue to Use Evidence]")
    positions = [i for i, token in enumerate(generation.tokens) if token.strip() == "[No Retrieval]"]
    remap = []
    for position in positions:
        odds = generation.distribution(position, names)
        total = odds["[Retrieval]"] + odds["[No Retrieval]"]
        remap.append(
            total > 0 and (odds["[Retrieval]"] + odds["[Continue to Use Evidence]"]) / total > threshold
        )
    pieces = text.split("[No Retrieval]")
    return "".join(
        piece + ("[Retrieval]" if i < len(remap) and remap[i] else "[No Retrieval]")
        for i, piece in enumerate(pieces)
    )


@dataclass(frozen=True)
class _Node:
    """A path of the long-form beam search: the segments so far (without what follows a "[Retrieval]"),
    the passage each was written from, the last segment as written, and the product of segment scores."""

    text: str
    segments: tuple[str, ...]
    passages: tuple[Any, ...]
    written: str
    score: float | None


@register
class SelfRAG(RAGProgram):
    """Self-RAG with a real checkpoint: reflection tokens read from the token probabilities of a Self-RAG
    model served by vLLM (Asai et al., 2024; scoring as in the authors' short-form inference).

    1. The prompt (Self-RAG's ``### Instruction: ... ### Response:`` format) is completed by one token; the
       retrieval probability P([Retrieval]) / (P([Retrieval]) + P([No Retrieval])) at that token is compared
       with ``threshold`` (the paper's delta). Not above it: the answer is generated after ``[No Retrieval]``.
    2. Otherwise ``top_k`` passages are retrieved and, for each, the checkpoint continues the prompt after
       ``[Retrieval]<paragraph>title\\ntext</paragraph>`` (one call per passage, concurrently).
    3. Each candidate scores ``w_rel * relevance + w_sup * support + w_use * utility`` (see
       :func:`reflection_scores`), plus the generation's probability (exp of its mean token log probability)
       when ``use_seqscore`` (the paper's segment score; the README's short- and long-form commands turn it
       on with ``--use_seqscore``). For open tasks (``short``, ``long``) the best candidate's text is the
       answer, ties keeping the retrieval order; for closed tasks (``yesno``, the authors' ``closed`` runs
       for PubHealth and ARC) the candidates' post-processed answers are grouped, their scores summed, and
       the answer with the highest sum wins (ties: the one seen first). Answers are post-processed as the
       authors' (:func:`clean_generation`).

    Long answers (``task="long"``, the paper's ASQA runs, ``run_long_form_static.py``) are written segment by
    segment with a beam search: from each path in the beam (first: the empty answer) the checkpoint
    continues the prompt and the path's text after each retrieved passage; a segment is scored as above and
    a path's score is the product of its segments' scores; the ``beam_width`` best paths are kept, and a
    path continues only while its last segment asks for "[Retrieval]" (its text is cut there), for at most
    ``max_depth - 1`` segments. The best path of the deepest level is the answer (the second best when the
    best is empty): its segments post-processed (:func:`long_form_text`), repeats dropped, joined.

    The LM in use must be the checkpoint's OpenAI-compatible endpoint (``openai/<model>`` with ``api_base``);
    any other LM gets an error naming ``self-rag-prompted``. Replies are not cached.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``threshold=0.2``).
        max_tokens: Tokens per generation (default: the README's commands: 100 for short answers as for
            PopQA and TriviaQA, 50 for yes/no as for PubHealth and ARC, 300 for long answers as for ASQA).

    Example:
        >>> from ragsuite import programs
        >>> knobs = programs.get("self-rag").default_knobs()
        >>> knobs["top_k"], knobs["threshold"], knobs["use_seqscore"], knobs["beam_width"], knobs["max_depth"]
        (5, 0.2, True, 2, 7)
    """

    name: ClassVar[str] = "self-rag"
    NEEDS_LOGPROBS: ClassVar[bool] = True
    KNOBS: ClassVar[Knobs] = Knobs(
        SHARED_KNOBS["top_k"],
        probability(
            "threshold",
            0.2,
            search=Floats(0.0, 1.0),
            help="retrieve when the normalized P([Retrieval]) is above this (the paper's 0.2)",
        ),
        *(SHARED_KNOBS[name] for name in ("w_rel", "w_sup", "w_use")),
        flag(
            "use_seqscore",
            True,
            search=OneOf((True, False)),
            help="add the generation's probability to each candidate's score",
        ),
        integer(
            "beam_width", 2, minimum=1, help="paths kept per segment in long-form generation (the authors' 2)"
        ),
        integer(
            "max_depth",
            7,
            minimum=2,
            help="the long-form search depth T (the README's ASQA command: 7, so at most 6 segments)",
        ),
    )

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        max_tokens: int | None = None,
        **knobs: Any,
    ) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        default_tokens = {"short": 100, "yesno": 50, "long": 300}[task]
        self.max_tokens = check_int(
            "max_tokens", default_tokens if max_tokens is None else max_tokens, minimum=1
        )

    def score(self, scores: dict[str, float]) -> float:
        """A candidate's segment score from its :func:`reflection_scores`."""
        total = (
            self.w_rel * scores["relevance"] + self.w_sup * scores["support"] + self.w_use * scores["utility"]
        )
        return total + (scores["sequence"] if self.use_seqscore else 0.0)

    async def _long_form(
        self, ledger: RunLedger, client: CheckpointClient, prompt: str, passages: list[Any]
    ) -> dspy.Prediction:
        """The segment-level beam search of the class docstring (the authors' ``call_model_beam_batch``)."""
        beam = [_Node(text="", segments=(), passages=(), written="[Retrieval]", score=None)]
        deepest: list[_Node] = []
        for depth in range(1, self.max_depth):
            if any(node.written == "</s>" for node in beam):
                break  # the authors stop the whole search at a path that has ended
            children: list[_Node] = []
            for node in beam:
                if "[Retrieval]" not in node.written:
                    continue  # the segment did not ask for more evidence: the path ends
                generations = await concurrently(
                    lambda p, node=node: self.acall_stage(
                        ledger,
                        "segment",
                        client,
                        prompt=prompt + node.text + paragraph(p),
                        max_tokens=self.max_tokens,
                    ),
                    passages,
                )
                for passage, generation in zip(passages, generations, strict=True):
                    scores = reflection_scores(generation)
                    score = self.score(scores)
                    written = _remap_no_retrieval(generation, self.threshold)
                    segment = written.split("[Retrieval]", 1)[0]
                    total = score if node.score is None else score * node.score
                    children.append(
                        _Node(
                            text=node.text + segment,
                            segments=(*node.segments, segment),
                            passages=(*node.passages, passage),
                            written=written,
                            score=total,
                        )
                    )
                    ledger.record(
                        "segment",
                        depth=depth,
                        passage_id=passage.id,
                        segment=long_form_text(segment),
                        **{k: round(v, 4) for k, v in scores.items()},
                        score=round(score, 4),
                        path_score=round(total, 4),
                    )
            if not children:
                break
            # A stable sort: among equal scores the earlier path (beam order, then passage order) stays first.
            beam = sorted(children, key=lambda node: node.score, reverse=True)[: self.beam_width]
            deepest = beam
        best = deepest[0]
        if not long_form_text(" ".join(best.segments)).strip() and len(deepest) > 1:
            best = deepest[1]
        kept: list[str] = []
        used: list[Any] = []
        for segment, passage in zip(best.segments, best.passages, strict=True):
            text = long_form_text(segment)
            if not text or text in kept:
                continue
            kept.append(text)
            used.append(passage)
        answer = " ".join(" ".join(text.split()) for text in kept).strip()
        ledger.record(
            "answer", source="checkpoint", answer=answer, passage_ids=[p.id for p in used], segments=len(kept)
        )
        return self.finish(ledger, answer, merge_passages([used]))

    def _answer(self, text: str) -> str:
        answer = clean_generation(text)
        if self.task == "yesno":
            word = next((w for w in answer.lower().replace(".", " ").split() if w in ("yes", "no")), "")
            return word or answer
        return answer

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        lm = dspy.settings.lm
        if lm is None:
            raise ConfigError("self-rag needs an LM: dspy.configure(lm=...) with a Self-RAG checkpoint")
        client = CheckpointClient(lm)
        try:
            return await self._run(ledger, client, question)
        finally:
            client.close()

    async def _run(self, ledger: RunLedger, client: CheckpointClient, question: str) -> dspy.Prediction:
        prompt = self_rag_prompt(question, self.task)
        first = await self.acall_stage(ledger, "decide", client, prompt=prompt, max_tokens=1)
        odds = first.distribution(0, RETRIEVE_TOKENS)
        # Neither token among the alternatives: both get exp(-100), so 0.5, as the original's two -100s.
        p_retrieve = odds["[Retrieval]"] / sum(odds.values())
        retrieve = p_retrieve > self.threshold
        ledger.record("decide", retrieve=retrieve, p_retrieve=round(p_retrieve, 4))
        passages = await aretrieve_recorded(self, ledger, question, self.top_k) if retrieve else []
        if retrieve:
            ledger.count_step()
        if not passages:
            plain = await self.acall_stage(
                ledger, "generate", client, prompt=prompt + "[No Retrieval]", max_tokens=self.max_tokens
            )
            if self.task == "long":  # the authors keep the first paragraph of a long answer
                answer = long_form_text(plain.text.split("\n\n")[0]).strip()
            else:
                answer = self._answer(plain.text)
            ledger.record("answer", source="none", answer=answer)
            return self.finish(ledger, answer, [])
        if self.task == "long":
            return await self._long_form(ledger, client, prompt, passages)
        generations = await concurrently(
            lambda p: self.acall_stage(
                ledger, "critique", client, prompt=prompt + paragraph(p), max_tokens=self.max_tokens
            ),
            passages,
        )
        scored = [reflection_scores(g) for g in generations]
        totals = [self.score(s) for s in scored]
        for passage, generation, scores, total in zip(passages, generations, scored, totals, strict=True):
            ledger.record(
                "critique",
                passage_id=passage.id,
                candidate=clean_generation(generation.text),
                **{k: round(v, 4) for k, v in scores.items()},
                score=round(total, 4),
            )
        if self.task == "yesno":
            # The authors' closed tasks: sum the scores of candidates giving the same answer.
            sums: dict[str, float] = {}
            for generation, total in zip(generations, totals, strict=True):
                key = strip_control_tokens(generation.text)
                sums[key] = sums.get(key, 0.0) + total
            chosen = max(sums, key=lambda key: sums[key])  # the first of equal sums, as a stable sort
            kept = [
                p
                for p, g in zip(passages, generations, strict=True)
                if strip_control_tokens(g.text) == chosen
            ]
            answer = self._answer(chosen)
            ledger.record(
                "answer",
                source="checkpoint",
                answer=answer,
                sums={clean_generation(k): round(v, 4) for k, v in sums.items()},
                passage_ids=[p.id for p in kept],
            )
        else:
            best = max(range(len(passages)), key=lambda i: (totals[i], -i))
            answer = self._answer(generations[best].text)
            kept = [passages[best]]
            ledger.record("answer", source="checkpoint", answer=answer, passage_id=passages[best].id)
        return self.finish(ledger, answer, kept, candidates=[clean_generation(g.text) for g in generations])


__all__ = [
    "CheckpointClient",
    "Generation",
    "SelfRAG",
    "SelfRAGPrompted",
    "clean_generation",
    "reflection_scores",
    "self_rag_prompt",
    "strip_control_tokens",
]
