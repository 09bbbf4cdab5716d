"""Retrieval quality and speed: ragsuite's BM25Retriever against plain bm25s, side by side, on every dataset.

    python benchmarks/retrieval.py [--datasets NAME ...] [--repeats 5] [--data-dir DIR] [--out FILE.json]
    python benchmarks/retrieval.py --report FILE.json [--docs docs/retrieval.md]
    python benchmarks/retrieval.py --hybrid [--records FILE.json] [--docs docs/retrieval.md]

For each dataset with a corpus, every column (retriever) answers the dev questions; the table reports
recall@5 / recall@10 of gold passages and queries per second, batched (one call for all questions) and one by
one. Timing runs of the columns are interleaved and repeated, and the median is kept, so that load from other
processes hits every column alike. "plain bm25s" is the reference configuration: Snowball English stemmer,
bm25s' English stopwords, title and text joined by a space, method lucene, k1 = 1.5, b = 0.75; its query time
includes ``bm25s.tokenize`` just as ragsuite's includes its own tokenizer. "plain bm25s numba" is the same
index with bm25s' numba backend, its fastest; batches of both bm25s columns use every core, ragsuite's once
large enough to gain from it. A bm25s batch returns passage numbers, which the column maps to ids. "ragsuite
BM25 ids" is the like-for-like call, ``batch_ids`` (ids only); "ragsuite BM25" returns whole passages, title
and text read from the index's passage store, as a program gets them.

``--out FILE.json`` also writes the run's records: every row's figures (each timing run's, not only the
median), the settings, the machine (cores, load average, nice value, Python and package versions) and the
command. ``--report FILE.json`` runs nothing: it prints the Markdown report of such a file, from the file
alone, and with ``--docs PAGE`` writes it between the page's ``<!-- bm25-vs-bm25s:start -->`` and
``<!-- bm25-vs-bm25s:end -->`` markers.

Adding a column: write ``def build_x(corpus, *, cache_dir) -> Column`` and list it in ``COLUMNS``.

``--hybrid`` measures BM25, dense retrieval with all-MiniLM-L6-v2 (the ``dense`` extra; passage embeddings
are cached in ragsuite's cache directory, ``--dense-cache-dir``, because embedding every corpus takes ~20
minutes on 2 CPU cores) and their fusions instead: interleave, RRF and linear at the library's default weights
and at weights tuned per dataset, recall@5/10 and ms per query. The defaults are fitted jointly on every
question of every dataset and checked one dataset at a time against the fit made without it (leave one
dataset out). The tuned fusions are fitted per dataset on half of its questions (by a hash of their id) and
also reported on the other, "held-out" half. ``--records FILE``
writes the run's records (JSON), ``--docs PAGE`` replaces the tables between the fusion markers of a docs
page, and ``--render FILE`` re-renders them from saved records without measuring anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragsuite.data.datasets import dataset_names, get_dataset_info, load_corpus, load_dataset
from ragsuite.data.metrics import retrieval_recall
from ragsuite.retrieval.base import Passage

K = 10
ROOT = Path(__file__).resolve().parents[1]
#: The data a run reads unless ``--data-dir`` names other: the committed fixtures.
FIXTURE_DATA = "tests/fixtures/data"
#: The page section the BM25-against-bm25s report is written into (``--report FILE --docs PAGE``).
MARKERS = "bm25-vs-bm25s"
#: The packages whose versions a records file keeps.
PACKAGES = ("ragsuite", "bm25s", "numba", "numpy", "PyStemmer")
#: The columns the report compares: the reference, bm25s' fastest backend, ragsuite's ``batch`` and
#: ``batch_ids``.
REF, FAST, OURS, IDS = "plain bm25s", "plain bm25s numba", "ragsuite BM25", "ragsuite BM25 ids"
#: The "plain bm25s" columns' text processing: PyStemmer's Snowball algorithm, bm25s' stopword list.
STEMMER, STOPWORDS = "english", "en"


@dataclass
class Column:
    """One retriever under test: ``batch`` and ``one`` return passage ids, best first."""

    name: str
    batch: Callable[[Sequence[str], int], list[list[str]]]
    one: Callable[[str, int], list[str]] | None  # None: only batches are timed
    timed: bool = True  # remote or slow retrievers can opt out of the speed columns


def build_plain_bm25s(corpus: list[Passage], *, cache_dir: Path, backend: str = "numpy") -> Column:
    import bm25s
    import numpy as np
    import Stemmer

    del cache_dir
    stemmer = Stemmer.Stemmer(STEMMER)
    retriever = bm25s.BM25(backend=backend)
    tokens = bm25s.tokenize(
        [f"{p.title} {p.text}" for p in corpus], stopwords=STOPWORDS, stemmer=stemmer, show_progress=False
    )
    retriever.index(tokens, show_progress=False)
    ids = np.array([p.id for p in corpus], dtype=object)

    def batch(queries: Sequence[str], k: int, threads: int = os.cpu_count() or 1) -> list[list[str]]:
        q = bm25s.tokenize(list(queries), stopwords=STOPWORDS, stemmer=stemmer, show_progress=False)
        docs, _ = retriever.retrieve(q, k=min(k, len(corpus)), show_progress=False, n_threads=threads)
        return [ids[row].tolist() for row in docs]

    def one(query: str, k: int) -> list[str]:
        return batch([query], k, threads=0)[0]  # one query: no thread pool

    return Column("plain bm25s" if backend == "numpy" else f"plain bm25s {backend}", batch, one)


def build_plain_bm25s_numba(corpus: list[Passage], *, cache_dir: Path) -> Column:
    """bm25s' numba backend (its fastest): compiled scoring and top-k, batches on every core."""
    return build_plain_bm25s(corpus, cache_dir=cache_dir, backend="numba")


def build_ragsuite_bm25(corpus: list[Passage], *, cache_dir: Path) -> Column:
    from ragsuite.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever(corpus, cache_dir=cache_dir)

    def batch(queries: Sequence[str], k: int) -> list[list[str]]:
        return [[p.id for p in ps] for ps in retriever.batch(queries, k)]

    def one(query: str, k: int) -> list[str]:
        return [p.id for p in retriever(query, k)]

    return Column("ragsuite BM25", batch, one)


def build_ragsuite_bm25_ids(corpus: list[Passage], *, cache_dir: Path) -> Column:
    """ragsuite's ``batch_ids``: the ids of the top k, no passage text read (what a bm25s batch returns)."""
    from ragsuite.retrieval.bm25 import BM25Retriever

    return Column("ragsuite BM25 ids", BM25Retriever(corpus, cache_dir=cache_dir).batch_ids, None)


# Reference column first: ratios are taken against it.
COLUMNS: list[Callable[..., Column]] = [
    build_plain_bm25s,
    build_plain_bm25s_numba,
    build_ragsuite_bm25,
    build_ragsuite_bm25_ids,
]

HYBRID_MODES = ("interleave", "rrf", "linear")
MEMBERS = ("bm25", "dense")
#: The tables between these lines of a docs page are generated from a run's records.
DOCS_START, DOCS_END = "<!-- fusion-table:start -->", "<!-- fusion-table:end -->"
#: A fusion is "at its best member" within this much recall.
SLACK = 0.005
ALPHAS = [round(0.05 * i, 2) for i in range(21)]
#: The settings the default fit tries with each alpha: per mode, (rrf_k or norm) x depth.
FIT_GRID = {
    "rrf": [{"rrf_k": k, "depth": d} for k in (0, 5, 10, 20, 40, 60) for d in (20, 30, 50)],
    "linear": [{"norm": n, "depth": d} for n in ("minmax", "zscore") for d in (20, 30, 50)],
}


def fit_half(example_id: str) -> bool:
    """Whether a question is in the half fusion weights are fitted on (a fixed hash of its id)."""
    import hashlib

    return int(hashlib.sha1(example_id.encode()).hexdigest(), 16) % 2 == 0


def _recalls(ranked: Sequence[Sequence[str]], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    return {
        f"recall@{k}": statistics.fmean(retrieval_recall(r, g, k) for r, g in zip(ranked, golds, strict=True))
        for k in (5, 10)
    }


def _pick(items: Sequence, mask: Sequence[bool]) -> list:
    return [item for item, keep in zip(items, mask, strict=True) if keep]


def _margin(fused: dict[str, float], members: Sequence[dict[str, float]]) -> float:
    """The fusion's recall minus its best member's, the worse of k = 5 and 10."""
    return min(fused[m] - max(member[m] for member in members) for m in ("recall@5", "recall@10"))


def fusion_dataset(
    name: str,
    *,
    data_dir: str | None,
    cache_dir: Path,
    dense_cache_dir: Path | None,
    dense_model: str | None,
    trials: int,
    seed: int,
    repeats: int = 1,
) -> tuple[dict, dict]:
    """One dataset's record (every column's recall and ms per query, the tuned weights) and what fitting
    the defaults needs (the members' deep lists and the gold ids, per half)."""
    from ragsuite.retrieval.bm25 import BM25Retriever
    from ragsuite.retrieval.dense import DenseRetriever
    from ragsuite.retrieval.hybrid import FusionSearch, HybridRetriever
    from ragsuite.retrieval.sweep import fused_metrics, member_lists, sweep_fusion

    corpus = load_corpus(name, data_dir=data_dir)
    examples = [ex for ex in load_dataset(name, data_dir=data_dir) if ex.gold_passage_ids]
    questions = [ex.question for ex in examples]
    golds = [list(ex.gold_passage_ids) for ex in examples]
    fit = [fit_half(str(ex.id)) for ex in examples]
    held = [not f for f in fit]
    bm25 = BM25Retriever.from_dataset(name, data_dir=data_dir, cache_dir=cache_dir)
    dense = DenseRetriever.from_dataset(
        name, data_dir=data_dir, model=dense_model, cache_dir=dense_cache_dir, progress=True
    )
    retrievers = {"bm25": bm25, "dense": dense}
    retrievers.update({m: HybridRetriever([bm25, dense], mode=m) for m in HYBRID_MODES})
    record: dict = {"dataset": name, "passages": len(corpus), "questions": len(examples), "columns": {}}
    record["fit_questions"], record["held_out_questions"] = sum(fit), sum(held)
    ranked: dict[str, list[list[str]]] = {}
    times: dict[str, list[float]] = {label: [] for label in retrievers}
    for retriever in retrievers.values():
        retriever.batch(questions[:8], K)  # warm-up
    # Rounds interleave the columns, so that load from other processes hits every column alike.
    for _ in range(max(1, repeats)):
        for label, retriever in retrievers.items():
            start = time.perf_counter()
            ranked[label] = [[p.id for p in ps] for ps in retriever.batch(questions, K)]
            times[label].append(1000 * (time.perf_counter() - start) / len(questions))
    for label, retriever in retrievers.items():
        record["columns"][label] = {
            **_recalls(ranked[label], golds),
            "held_out": _recalls(_pick(ranked[label], held), _pick(golds, held)),
            "ms_per_query": statistics.median(times[label]),
            "spec": retriever.describe()["spec"],
        }
    lists = member_lists(retrievers["rrf"], questions, depth=FusionSearch(retrievers["rrf"]).max_depth)
    for mode in ("rrf", "linear"):
        search = FusionSearch(retrievers[mode])
        result = sweep_fusion(
            search, _pick(lists, fit), _pick(golds, fit), metric="recall@5", trials=trials, seed=seed
        )
        record["columns"][f"{mode} tuned"] = {
            **fused_metrics(result.retriever, lists, golds, (5, 10)),
            "held_out": fused_metrics(result.retriever, _pick(lists, held), _pick(golds, held), (5, 10)),
            "ms_per_query": record["columns"][mode]["ms_per_query"],  # the same work, other numbers
            "spec": result.retriever.describe()["spec"],
            "params": result.params,
        }
        for cell in (record["columns"][f"{mode} tuned"], record["columns"][f"{mode} tuned"]["held_out"]):
            for key in [k for k in cell if k.startswith("all_gold")]:
                del cell[key]
    return record, {"hybrids": retrievers, "lists": lists, "golds": golds, "fit": fit}


def fit_defaults(records: Sequence[dict], fits: Sequence[dict]) -> dict:
    """The one member weighting per mode (BM25 ``1 - alpha``, dense ``alpha``) and settings that are best
    for the worst dataset: the largest smallest margin over its best member on every question of every
    dataset (ties: the larger mean margin). Each dataset is then checked against the fit made without it
    (leave one dataset out): the margin of the defaults on a dataset they were not fitted on.

    Every question, not half of each dataset: on halves of 24-50 questions a margin moves by a question's
    recall, and the halves' best fit lost up to 0.018 on the other halves."""
    from ragsuite.retrieval.sweep import fused_metrics

    names = [r["dataset"] for r in records]
    members = {
        name: [
            _recalls([[p.id for p in per[i][:K]] for per in f["lists"]], f["golds"])
            for i in range(len(MEMBERS))
        ]
        for name, f in zip(names, fits, strict=True)
    }

    def margins(mode: str, alpha: float, settings: dict) -> dict[str, float]:
        out = {}
        for name, f in zip(names, fits, strict=True):
            hybrid = f["hybrids"][mode].with_fusion(weights=[round(1 - alpha, 12), alpha], **settings)
            out[name] = _margin(fused_metrics(hybrid, f["lists"], f["golds"], (5, 10)), members[name])
        return out

    def best(scored: list[tuple[float, dict, dict]], over: Sequence[str]) -> tuple[float, dict, dict]:
        return max(
            scored,
            key=lambda s: (min(s[2][n] for n in over), statistics.fmean(s[2][n] for n in over)),
        )

    fitted = {}
    for mode, grid in FIT_GRID.items():
        scored = [(alpha, settings, margins(mode, alpha, settings)) for settings in grid for alpha in ALPHAS]
        alpha, settings, fit_margins = best(scored, names)
        left_out: dict[str, dict | None] = {}
        for name in names:
            others = [n for n in names if n != name]
            if not others:  # one dataset: nothing to fit without it
                left_out[name] = None
                continue
            other_alpha, other_settings, other_margins = best(scored, others)
            left_out[name] = {"alpha": other_alpha, "settings": other_settings, "margin": other_margins[name]}
        fitted[mode] = {
            "alpha": alpha,
            "settings": settings,
            "margins": fit_margins,
            "leave_one_out": left_out,
            "tried": len(scored),
        }
    return fitted


def _cell(column: dict, best: dict | None = None) -> str:
    text = f"{column['recall@5']:.3f} / {column['recall@10']:.3f}"
    if best is not None and _margin(column, [best]) < -SLACK:
        return f"{text} (below)"
    return text


def fusion_markdown(run: dict) -> str:
    """The docs tables of a ``--hybrid`` run's records."""
    records = run["datasets"]
    names = ["bm25", "dense", "interleave", "rrf", "rrf tuned", "linear", "linear tuned"]
    heads = ["BM25", "dense", "interleave", "RRF default", "RRF tuned", "linear default", "linear tuned"]
    lines = [
        'Recall@5 / recall@10 on every dev question with gold passages; "(below)" marks a fusion more than '
        f"{SLACK} under its best member at either k:",
        "",
        "| dataset | questions | " + " | ".join(heads) + " |",
        "|---|---:|" + "---:|" * len(heads),
    ]
    for r in records:
        cols = r["columns"]
        best = {m: max(cols[x][m] for x in MEMBERS) for m in ("recall@5", "recall@10")}
        cells = [_cell(cols[n], None if n in MEMBERS else best) for n in names]
        lines.append(f"| {r['dataset']} | {r['questions']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Tuned fusions on the held-out halves (the questions their weights were not tuned on): recall@5 / "
        "recall@10",
        "",
        "| dataset | tuned on / held-out questions | best member | RRF tuned | linear tuned |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in records:
        cols = r["columns"]
        best = {m: max(cols[x]["held_out"][m] for x in MEMBERS) for m in ("recall@5", "recall@10")}
        cells = [_cell(cols[n]["held_out"], best) for n in ("rrf tuned", "linear tuned")]
        lines.append(
            f"| {r['dataset']} | {r['fit_questions']} / {r['held_out_questions']} | {_cell(best)} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Milliseconds per query, one batch of every question, the median of the run's rounds (members "
        "queried concurrently; a tuned fusion does the same work as its default):",
        "",
        "| dataset | BM25 | dense | interleave | RRF | linear |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        cols = r["columns"]
        lines.append(
            f"| {r['dataset']} | "
            + " | ".join(
                f"{cols[n]['ms_per_query']:.2f}" for n in ("bm25", "dense", "interleave", "rrf", "linear")
            )
            + " |"
        )
    fit = run["defaults"]
    names = [r["dataset"] for r in records]
    lines += [
        "",
        "The defaults (BM25 weighted 1 - alpha, dense alpha), fitted on every question of every dataset: the "
        "alpha, rrf_k or norm, and depth whose worst margin over the better member (recall@5 or @10, any "
        "dataset) is largest. Each dataset's margin, then its margin under the defaults fitted on the other "
        "datasets only (left out):",
        "",
        "| fusion | alpha | settings | " + " | ".join(names) + " |",
        "|---|---:|---|" + "---:|" * len(names),
    ]
    for mode in ("rrf", "linear"):
        f = fit[mode]
        shown = ", ".join(f"{k}={v}" for k, v in f["settings"].items())
        cells = [_fit_cell(f["margins"][n], f["leave_one_out"][n]) for n in names]
        lines.append(f"| {mode} | {f['alpha']:.2f} | {shown} | " + " | ".join(cells) + " |")
    lines += ["", "Tuned settings per dataset (Optuna, recall@5 on the half it is tuned on):", ""]
    lines += ["| dataset | RRF tuned | linear tuned |", "|---|---|---|"]
    for r in records:
        cols = r["columns"]
        specs = [f"`{_short(cols[f'{mode} tuned']['spec'])}`" for mode in ("rrf", "linear")]
        lines.append(f"| {r['dataset']} | " + " | ".join(specs) + " |")
    return "\n".join(lines)


def _fit_cell(margin: float, left_out: dict | None) -> str:
    return f"{margin:+.3f}" + ("" if left_out is None else f" ({left_out['margin']:+.3f} left out)")


def _short(spec: str) -> str:
    """A spec without its members' dataset names (``bm25:nq@0.3`` -> ``bm25@0.3``)."""
    import re

    return re.sub(r"(bm25|dense):[A-Za-z0-9_]+", r"\1", spec)


def replace_docs_block(page: str, table: str) -> str:
    """``page`` with the text between the fusion markers replaced by ``table``."""
    head, start, rest = page.partition(DOCS_START)
    _, end, tail = rest.partition(DOCS_END)
    if not start or not end:
        raise SystemExit(f"the docs page has no {DOCS_START} ... {DOCS_END} block")
    return f"{head}{DOCS_START}\n{table}\n{DOCS_END}{tail}"


def fusion_run(
    datasets: Sequence[str],
    *,
    data_dir: str | None,
    cache_dir: Path,
    dense_cache_dir: Path | None,
    dense_model: str | None = None,
    trials: int,
    seed: int,
    repeats: int = 1,
) -> dict:
    """Every dataset's record, and the default weights fitted over all of them."""
    records, fits = [], []
    for name in datasets:
        print(f"fusion: {name} ...", file=sys.stderr, flush=True)
        record, fit = fusion_dataset(
            name,
            data_dir=data_dir,
            cache_dir=cache_dir,
            dense_cache_dir=dense_cache_dir,
            dense_model=dense_model,
            trials=trials,
            seed=seed,
            repeats=repeats,
        )
        records.append(record)
        fits.append(fit)
    from ragsuite.retrieval.hybrid import DEFAULT_SETTINGS, DEFAULT_WEIGHTS

    return {
        "datasets": records,
        "defaults": fit_defaults(records, fits),
        "library_defaults": {"weights": DEFAULT_WEIGHTS, "settings": DEFAULT_SETTINGS},
        "trials": trials,
        "seed": seed,
        "repeats": repeats,
    }


def _qps(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def bench_dataset(
    name: str,
    *,
    repeats: int,
    cache_dir: Path,
    data_dir: str | None,
    extra_columns: Sequence[Callable[..., Column]] = (),
) -> dict:
    corpus = load_corpus(name, data_dir=data_dir)
    examples = [ex for ex in load_dataset(name, data_dir=data_dir) if ex.gold_passage_ids]
    questions = [ex.question for ex in examples]
    columns = [build(corpus, cache_dir=cache_dir) for build in (*COLUMNS, *extra_columns)]
    row: dict = {"dataset": name, "passages": len(corpus), "questions": len(questions), "columns": {}}
    timing: dict[str, dict[str, list[float]]] = {c.name: {"batch": [], "one": []} for c in columns}
    for column in columns:
        ranked = column.batch(questions, K)
        row["columns"][column.name] = {
            f"recall@{k}": statistics.fmean(
                retrieval_recall(ids, ex.gold_passage_ids, k)
                for ids, ex in zip(ranked, examples, strict=True)
            )
            for k in (5, 10)
        }
        if column.one is not None:
            column.one(questions[0], K)  # warm-up
    for _ in range(repeats):
        for column in (c for c in columns if c.timed):
            timing[column.name]["batch"].append(_qps(lambda c=column: c.batch(questions, K), len(questions)))
            if column.one is not None:
                timing[column.name]["one"].append(
                    _qps(lambda c=column: [c.one(q, K) for q in questions], len(questions))
                )
    for column in (c for c in columns if c.timed):
        for mode, runs in timing[column.name].items():
            if runs:
                row["columns"][column.name][f"qps_{mode}"] = statistics.median(runs)
                row["columns"][column.name][f"qps_{mode}_runs"] = runs
    return row


def plain_bm25s_settings() -> dict:
    """The reference configuration of the "plain bm25s" columns, the scoring parameters read from bm25s."""
    import bm25s

    index = bm25s.BM25()
    return {
        "stemmer": STEMMER,
        "stopwords": STOPWORDS,
        "text": "title + text",
        "method": index.method,
        "k1": index.k1,
        "b": index.b,
    }


def markdown(rows: list[dict]) -> str:
    """The Markdown table of the rows, as the script prints it after a run."""
    ref, fast, ours, ids = REF, FAST, OURS, IDS
    lines = [
        "| dataset | passages | questions | R@5 plain | R@5 ragsuite | R@10 plain | R@10 ragsuite "
        "| q/s batch plain | q/s batch plain numba | q/s batch ragsuite ids | ratio to numba "
        "| q/s batch ragsuite passages | ratio to numba "
        "| q/s 1-by-1 plain | q/s 1-by-1 plain numba | q/s 1-by-1 ragsuite | ratio to plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        a, n, b, i = (row["columns"][name] for name in (ref, fast, ours, ids))
        lines.append(
            f"| {row['dataset']} | {row['passages']} | {row['questions']} "
            f"| {a['recall@5']:.3f} | **{b['recall@5']:.3f}** "
            f"| {a['recall@10']:.3f} | **{b['recall@10']:.3f}** "
            f"| {a['qps_batch']:,.0f} | {n['qps_batch']:,.0f} "
            f"| {i['qps_batch']:,.0f} | {i['qps_batch'] / n['qps_batch']:.2f}x "
            f"| {b['qps_batch']:,.0f} | {b['qps_batch'] / n['qps_batch']:.2f}x "
            f"| {a['qps_one']:,.0f} | {n['qps_one']:,.0f} | {b['qps_one']:,.0f} "
            f"| {b['qps_one'] / a['qps_one']:.2f}x |"
        )
    return "\n".join(lines)


def _span(values: Sequence[float], form: str) -> str:
    """``low to high`` of ``values`` in ``form`` (one figure when they print alike; no ``-0.0``)."""
    low, high = (float(format(x, form)) + 0.0 for x in (min(values), max(values)))
    return format(low, form) if format(low, form) == format(high, form) else f"{low:{form}} to {high:{form}}"


def report(records: dict) -> str:
    """The Markdown report of a records file (``--out``), from the file alone: one sentence on what was run,
    where and how, the table, then what it shows across the datasets."""
    s, m, rows = records["settings"], records["machine"], records["rows"]
    plain = s["plain_bm25s"]
    versions = ", ".join(f"{name} {version}" for name, version in m["packages"].items() if version)
    load = "/".join(f"{x:.1f}" for x in m["load_average"])
    took = f"{records['wall_s']:.0f} s" if records["wall_s"] < 120 else f"{records['wall_s'] / 60:.0f} min"
    offsets = [
        run / column[f"qps_{mode}"] - 1
        for row in rows
        for column in row["columns"].values()
        for mode in ("batch", "one")
        for run in column.get(f"qps_{mode}_runs", [])
    ]
    offsets.sort(key=abs)
    usual = offsets[max(0, (9 * len(offsets) + 9) // 10 - 1)]  # 9 in 10 runs are at most this far off
    spread = (
        f"single runs {100 * min(offsets):+.0f}% to {100 * max(offsets):+.0f}% off their median, 9 in 10 of "
        f"them within {100 * abs(usual):.0f}%"
    )
    reference = (
        f'PyStemmer\'s Snowball "{plain["stemmer"]}" stemmer, bm25s\' "{plain["stopwords"]}" stopwords, '
        f"{plain['text']}, method {plain['method']}, k1 = {plain['k1']:g}, b = {plain['b']:g}"
    )
    sentence = (
        f"One run of `{records['command']}` ({took}) on {m['cpus']} cores (load average {load} at its start, "
        f"nice {m['nice']}; Python {m['python']}, {versions}): every question with gold passages of each "
        f"dataset, k = {s['k']}; R@5 and R@10 are the mean share of a question's gold passages in its top 5 "
        f"and 10, q/s the median of {s['repeats']} interleaved timing runs of every column, query tokenizing "
        f'included ({spread}). "plain" is bm25s with {reference}; "plain '
        "numba\" the same index on bm25s' numba backend. A batch is one call for all of a dataset's "
        "questions (bm25s' with a thread per core, ragsuite's on every core once the batch is large enough "
        'to gain from it); a bm25s batch returns passage numbers (mapped to ids), so "ragsuite ids" is the '
        'like-for-like call, `batch_ids`, and "ragsuite passages" is `batch`, which also reads each '
        "passage's title and text from the index's passage store."
    )
    cols = [[row["columns"][name] for name in (REF, FAST, OURS, IDS)] for row in rows]
    gain5 = [100 * (b["recall@5"] - a["recall@5"]) for a, _, b, _ in cols]
    gain10 = [100 * (b["recall@10"] - a["recall@10"]) for a, _, b, _ in cols]
    higher = sum(g > 0 for g in gain5)
    across = (
        f"Recall@5, ragsuite against plain bm25s: {_span(gain5, '+.1f')} points (higher on {higher} of "
        f"{len(rows)} datasets); recall@10: {_span(gain10, '+.1f')} points. One by one, ragsuite answers "
        f"{_span([b['qps_one'] / a['qps_one'] for a, _, b, _ in cols], '.2f')}x as many queries per second "
        f"as plain bm25s. Batched against bm25s' numba backend, `batch_ids` answers "
        f"{_span([i['qps_batch'] / n['qps_batch'] for _, n, _, i in cols], '.2f')}x as many and `batch` "
        f"{_span([b['qps_batch'] / n['qps_batch'] for _, n, b, _ in cols], '.2f')}x."
    )
    return "\n".join([sentence, "", markdown(rows), "", across])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    with_corpus = [n for n in dataset_names() if get_dataset_info(n).has_corpus]
    parser.add_argument("--datasets", nargs="+", default=with_corpus, choices=with_corpus)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing runs per column (median)")
    parser.add_argument(
        "--data-dir", default=None, help=f"datasets (default: the committed fixtures, {FIXTURE_DATA})"
    )
    parser.add_argument(
        "--cache-dir", default=None, help="index cache (default: a fresh temporary directory)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the run's records (JSON) here")
    parser.add_argument(
        "--report", type=Path, metavar="FILE.json", help="print the report of a records file; run nothing"
    )
    parser.add_argument(
        "--hybrid",
        action="store_true",
        help="measure BM25, dense (MiniLM) and their fusions at default and tuned weights instead",
    )
    parser.add_argument(
        "--dense-cache-dir", default=None, help="passage embedding cache (default: ragsuite's cache dir)"
    )
    parser.add_argument(
        "--dense-model", default=None, help="--hybrid: an encoder directory (default: MiniLM)"
    )
    parser.add_argument("--trials", type=int, default=60, help="--hybrid: Optuna trials per tuned fusion")
    parser.add_argument("--seed", type=int, default=0, help="--hybrid: the tuning sampler's seed")
    parser.add_argument("--records", default=None, help="--hybrid: write the run's records (JSON) here")
    parser.add_argument(
        "--docs",
        default=None,
        help=f"with --report: write the report between this page's {MARKERS} markers; with --hybrid or "
        "--render: rewrite its fusion tables",
    )
    parser.add_argument(
        "--render", default=None, help="print (and --docs: write) the tables of saved records"
    )
    args = parser.parse_args(argv)
    data_dir = args.data_dir or str(ROOT / FIXTURE_DATA)
    if args.report:
        text = report(json.loads(args.report.read_text(encoding="utf-8")))
        print(text)
        if args.docs:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from real_lm import write_between_markers

            write_between_markers(Path(args.docs), MARKERS, text)
        return 0
    if args.hybrid or args.render:
        if args.render:
            run = json.loads(Path(args.render).read_text(encoding="utf-8"))
        else:
            with tempfile.TemporaryDirectory(prefix="ragsuite-bench-") as tmp:
                run = fusion_run(
                    args.datasets,
                    data_dir=data_dir,
                    cache_dir=Path(args.cache_dir or tmp),
                    dense_cache_dir=Path(args.dense_cache_dir) if args.dense_cache_dir else None,
                    dense_model=args.dense_model,
                    trials=args.trials,
                    seed=args.seed,
                    repeats=args.repeats,
                )
            if args.records:
                Path(args.records).parent.mkdir(parents=True, exist_ok=True)
                Path(args.records).write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        table = fusion_markdown(run)
        print(table)
        if args.docs:
            page = Path(args.docs)
            page.write_text(replace_docs_block(page.read_text(encoding="utf-8"), table), encoding="utf-8")
        return 0
    if args.docs:
        parser.error("--docs goes with --report, --hybrid or --render")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_engines import machine

    command = shlex.join(["python", "benchmarks/retrieval.py", *(sys.argv[1:] if argv is None else argv)])
    facts = machine(PACKAGES)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragsuite-bench-") as tmp:
        cache_dir = Path(args.cache_dir or tmp)
        rows = []
        for name in args.datasets:
            print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
            rows.append(bench_dataset(name, repeats=args.repeats, cache_dir=cache_dir, data_dir=data_dir))
    print(markdown(rows))
    if args.out:
        records = {
            "benchmark": "retrieval",
            "command": command,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "wall_s": time.perf_counter() - started,
            "settings": {
                "datasets": args.datasets,
                "data_dir": args.data_dir or FIXTURE_DATA,
                "repeats": args.repeats,
                "k": K,
                "columns": list(rows[0]["columns"]) if rows else [],
                "plain_bm25s": plain_bm25s_settings(),
            },
            "machine": facts,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
