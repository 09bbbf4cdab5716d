"""Dense retrieval at scale: recall of the approximate FAISS indexes against exact search, their memory and
speed at a million passages, and the encoder's speed with length-sorted batches.

    python benchmarks/dense_scale.py [--datasets hotpotqa nq ...] [--cache-dir DIR] [--scale-n 1000000]
        [--scale-kinds flat ivfpq hnsw] [--skip-recall] [--skip-scale] [--encode-sample 384]

1. Recall (real data). For every dataset with a corpus, the passages are embedded with all-MiniLM-L6-v2 (the
   ``dense`` extra; cached in ragsuite's cache directory, or ``--cache-dir``: ~20 minutes on 2 CPU cores the
   first time) and the dev questions are searched with exact inner product (``flat``) and with each
   approximate index at ragsuite's default settings for that corpus size, plus variants. The table gives
   recall@5 of the gold passages, its change against exact search in points, and the overlap of the top 5
   with the exact top 5. A "pooled" row searches all corpora joined into one (each dataset's questions
   against all passages), the largest real corpus at hand.
2. Scale (synthetic vectors). The encoder runs ~20 passages/s on CPU, so the million-passage part uses random
   unit vectors of the encoder's dimension (384), drawn around 20,000 random centres so that the data has
   clusters, written as float32 ``.npy`` like ragsuite's embedding cache. Each index kind is built in a
   fresh process and searched in another one as DenseRetriever does it (the index loaded from disk, the
   embeddings memory-mapped, IVF-PQ candidates re-scored from rows read from the file), and each reports
   its peak resident set size (``resource.getrusage``), so that the memory of one step never counts in
   another. A baseline process that only imports numpy and faiss gives
   the floor. Recall is not measured on synthetic vectors (it says nothing about real text).
3. Encoding (real data). ``--encode-sample`` passages of HotpotQA embedded in corpus order and in
   length-sorted batches, alternately, twice each; passages/s and the largest difference between the two
   results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K = 5
DIM = 384


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# -- 1. recall on the dev corpora -------------------------------------------------------------------------

RECALL_CONFIGS: list[tuple[str, dict]] = [
    ("flat (exact)", {"index": "flat"}),
    ("ivfpq default", {"index": "ivfpq"}),
    ("ivfpq rerank=4", {"index": "ivfpq", "rerank": 4}),
    ("ivfpq nprobe=32", {"index": "ivfpq", "nprobe": 32}),
    ("hnsw default", {"index": "hnsw"}),
]


def recall_rows(datasets: list[str], *, data_dir: str | None, cache_dir: str | None) -> list[dict]:
    from ragsuite.data.datasets import load_corpus, load_dataset
    from ragsuite.data.metrics import retrieval_recall
    from ragsuite.retrieval import dense_index
    from ragsuite.retrieval.dense import DenseRetriever
    from ragsuite.retrieval.dense_index import IndexSettings

    pooled_vectors, pooled_ids, pooled_queries, pooled_gold = [], [], [], []
    seen: set[str] = set()

    def evaluate(name: str, vectors: np.ndarray, ids: list[str], queries: np.ndarray, gold: list) -> dict:
        row: dict = {"dataset": name, "passages": len(ids), "questions": len(queries), "columns": {}}
        exact_top: list[set[str]] = []
        for label, options in RECALL_CONFIGS:
            params = IndexSettings.from_options(options).resolve(len(ids), vectors.shape[1])
            index = dense_index.build_index(
                params, n=len(ids), dim=vectors.shape[1], batches=dense_index.array_batches(vectors)
            )
            _scores, found = dense_index.search(index, params, queries, K, vectors=vectors)
            ranked = [[ids[i] for i in row_ids if i >= 0] for row_ids in found]
            if label == "flat (exact)":
                exact_top = [set(r) for r in ranked]
            recall = statistics.fmean(retrieval_recall(r, g, K) for r, g in zip(ranked, gold, strict=True))
            overlap = statistics.fmean(
                len(set(r) & e) / max(len(e), 1) for r, e in zip(ranked, exact_top, strict=True)
            )
            row["columns"][label] = {"recall@5": recall, "overlap@5": overlap, "index": params["factory"]}
        return row

    rows = []
    for name in datasets:
        corpus = load_corpus(name, data_dir=data_dir)
        examples = [ex for ex in load_dataset(name, data_dir=data_dir) if ex.gold_passage_ids]
        retriever = DenseRetriever(corpus, cache_dir=cache_dir, dataset=name, progress=True)
        vectors = np.asarray(retriever.embeddings)
        queries = retriever._encode([ex.question for ex in examples])
        gold = [ex.gold_passage_ids for ex in examples]
        rows.append(evaluate(name, vectors, [p.id for p in corpus], queries, gold))
        print(f"  {name}: done", file=sys.stderr, flush=True)
        keep = [i for i, p in enumerate(corpus) if p.id not in seen]
        seen.update(corpus[i].id for i in keep)
        pooled_vectors.append(vectors[keep])
        pooled_ids += [corpus[i].id for i in keep]
        pooled_queries.append(queries)
        pooled_gold += gold
    if len(datasets) > 1:
        rows.append(
            evaluate(
                "pooled",
                np.concatenate(pooled_vectors),
                pooled_ids,
                np.concatenate(pooled_queries),
                pooled_gold,
            )
        )
    return rows


def recall_markdown(rows: list[dict]) -> str:
    labels = [label for label, _ in RECALL_CONFIGS]
    head = " | ".join(f"R@5 {label}" for label in labels)
    lines = [
        f"| dataset | passages | questions | {head} | top-5 overlap with exact: "
        + " / ".join(labels[1:])
        + " |",
        "|---|---:|---:|" + "---:|" * len(labels) + "---|",
    ]
    for row in rows:
        exact = row["columns"][labels[0]]["recall@5"]
        cells = [f"{exact:.3f}"]
        for label in labels[1:]:
            value = row["columns"][label]["recall@5"]
            cells.append(f"{value:.3f} ({100 * (value - exact):+.1f})")
        overlaps = " / ".join(f"{row['columns'][label]['overlap@5']:.3f}" for label in labels[1:])
        lines.append(
            f"| {row['dataset']} | {row['passages']} | {row['questions']} | "
            + " | ".join(cells)
            + f" | {overlaps} |"
        )
    factories = {label: rows[-1]["columns"][label]["index"] for label in labels}
    lines.append("")
    lines.append(f"Index of the last row: {factories}")
    return "\n".join(lines)


# -- 2. memory and speed at scale (synthetic vectors) ------------------------------------------------------


def write_synthetic(path: Path, n: int, *, dim: int = DIM, centres: int = 20_000, seed: int = 0) -> None:
    """Unit vectors around random centres, written block by block as a float32 .npy."""
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal((centres, dim)).astype(np.float32)
    with open(path, "wb") as handle:  # plain writes: this process' resident set stays small
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (n, dim)}
        )
        for lo in range(0, n, 4096):  # small float32 blocks: the workers inherit this process' peak RSS
            hi = min(lo + 4096, n)
            noise = rng.standard_normal((hi - lo, dim), dtype=np.float32)
            block = centre[rng.integers(0, centres, hi - lo)] + np.float32(0.7) * noise
            handle.write((block / np.linalg.norm(block, axis=1, keepdims=True)).astype("<f4").tobytes())


def worker(args: argparse.Namespace) -> None:
    """One measured step in this fresh process; prints one JSON line."""
    import faiss

    from ragsuite.retrieval import dense_index
    from ragsuite.retrieval.dense_index import IndexSettings

    result: dict = {"step": args.worker, "kind": args.kind}
    if args.worker == "baseline":
        result["peak_rss_mib"] = _rss_mib()
        print(json.dumps(result))
        return
    vectors_path, index_path = Path(args.vectors), Path(args.index)
    with open(vectors_path, "rb") as handle:
        (n, dim), _ = dense_index.read_npy_header(handle)
    params = IndexSettings.from_options({"index": args.kind}).resolve(n, dim)
    result["factory"] = params["factory"]
    started = time.perf_counter()
    if args.worker == "build" or params["type"] == "flat":  # a flat index is rebuilt from the file on load
        index = dense_index.build_index(params, n=n, dim=dim, batches=dense_index.npy_batches(vectors_path))
        result["build_s"] = time.perf_counter() - started
        if args.worker == "build" and params["type"] != "flat":
            dense_index.save_index(index, index_path)
            result["index_file_mib"] = index_path.stat().st_size / 2**20
    else:
        index = faiss.read_index(str(index_path))
        result["load_s"] = time.perf_counter() - started
    if args.worker == "search":
        mapped = np.load(vectors_path, mmap_mode="r")  # as DenseRetriever.embeddings; not read here
        vectors = dense_index.NpyRows(vectors_path)  # as DenseRetriever re-scores IVF-PQ candidates
        result["mapped_rows"] = len(mapped)
        rng = np.random.default_rng(1)
        picked = np.sort(rng.choice(n, args.queries, replace=False))
        queries = vectors(picked) + 0.05 * rng.standard_normal((args.queries, dim))
        queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
        dense_index.search(index, params, queries[:10], K, vectors=vectors)  # warm-up
        started = time.perf_counter()
        dense_index.search(index, params, queries, K, vectors=vectors)
        result["ms_per_query_batched"] = 1000 * (time.perf_counter() - started) / args.queries
        started = time.perf_counter()
        for q in queries[:100]:
            dense_index.search(index, params, q[None], K, vectors=vectors)
        result["ms_per_query_one"] = 1000 * (time.perf_counter() - started) / 100
    result["peak_rss_mib"] = _rss_mib()
    result["vm_hwm_mib"] = _status_mib("VmHWM")
    result["rss_anon_mib_end"] = _status_mib("RssAnon")
    result["rss_file_mib_end"] = _status_mib("RssFile")
    print(json.dumps(result))


def _run_worker(step: str, kind: str, vectors: Path, index: Path, queries: int) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        step,
        "--kind",
        kind,
        "--vectors",
        str(vectors),
        "--index",
        str(index),
        "--queries",
        str(queries),
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def scale_rows(n: int, kinds: list[str], *, workdir: Path, queries: int) -> list[dict]:
    vectors = workdir / f"synthetic-{n}.npy"
    if not vectors.is_file():
        started = time.perf_counter()
        write_synthetic(vectors, n)
        print(f"  wrote {vectors} in {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    baseline = _run_worker("baseline", "flat", vectors, vectors, 0)
    rows = [{**baseline, "kind": "baseline (numpy + faiss imported)", "launcher_peak_rss_mib": _rss_mib()}]
    for kind in kinds:
        index = workdir / f"synthetic-{n}.{kind}.faiss"
        build = _run_worker("build", kind, vectors, index, queries)
        print(f"  {kind}: built in {build['build_s']:.0f}s", file=sys.stderr, flush=True)
        search = _run_worker("search", kind, vectors, index, queries)
        rows.append({"kind": kind, "n": n, "build": build, "search": search})
        print("  " + json.dumps(rows[-1]), file=sys.stderr, flush=True)
        index.unlink(missing_ok=True)
    return rows


def scale_markdown(rows: list[dict], n: int) -> str:
    lines = [
        f"Synthetic: {n:,} unit vectors x {DIM} float32 = {n * DIM * 4 / 2**20:,.0f} MiB on disk. "
        f"Baseline process (numpy and faiss imported) peak RSS: {rows[0]['peak_rss_mib']:,.0f} MiB "
        f"(the launching process: {rows[0]['launcher_peak_rss_mib']:,.0f} MiB).",
        "",
        "| index | factory | build s | index file MiB | peak RSS build MiB | peak RSS search MiB "
        "| search RssAnon / RssFile at end MiB | ms/query (batch) | ms/query (one by one) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows[1:]:
        b, s = row["build"], row["search"]
        file_mib = f"{b['index_file_mib']:,.0f}" if "index_file_mib" in b else "(not saved)"
        lines.append(
            f"| {row['kind']} | {b['factory']} | {b['build_s']:.0f} | {file_mib} | {b['peak_rss_mib']:,.0f} "
            f"| {s['peak_rss_mib']:,.0f} | {s['rss_anon_mib_end']:,.0f} / {s['rss_file_mib_end']:,.0f} "
            f"| {s['ms_per_query_batched']:.2f} | {s['ms_per_query_one']:.2f} |"
        )
    return "\n".join(lines)


# -- 3. length-sorted encoding -----------------------------------------------------------------------------


def encode_row(sample: int, *, data_dir: str | None, cache_dir: str | None) -> dict:
    from ragsuite.data.datasets import load_corpus
    from ragsuite.retrieval.dense import DenseRetriever

    corpus = load_corpus("hotpotqa", data_dir=data_dir)
    rng = np.random.default_rng(0)
    texts = [corpus[i].render() for i in rng.choice(len(corpus), sample, replace=False)]
    retriever = DenseRetriever(corpus[:1], cache_dir=cache_dir, persist=False)
    retriever._encode(texts[:32])  # warm-up
    times: dict[str, list[float]] = {"corpus order": [], "length-sorted": []}
    results = {}
    for _ in range(2):
        for label, sort in (("corpus order", False), ("length-sorted", True)):
            started = time.perf_counter()
            results[label] = retriever._encode(texts, sort=sort)
            times[label].append(time.perf_counter() - started)
    best = {label: min(t) for label, t in times.items()}
    return {
        "passages": sample,
        "passages_per_s": {label: sample / t for label, t in best.items()},
        "speedup": best["corpus order"] / best["length-sorted"],
        "max_abs_diff": float(np.abs(results["corpus order"] - results["length-sorted"]).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="*", default=None, help="default: every dataset with a corpus")
    parser.add_argument(
        "--data-dir",
        default=str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "data"),
        help="datasets (default: the committed fixtures, tests/fixtures/data)",
    )
    parser.add_argument("--cache-dir", default=None, help="where passage embeddings are cached")
    parser.add_argument("--scale-n", type=int, default=1_000_000)
    parser.add_argument("--scale-kinds", nargs="*", default=["flat", "ivfpq", "hnsw"])
    parser.add_argument("--queries", type=int, default=1000, help="synthetic queries per index")
    parser.add_argument("--workdir", default=None, help="keep (and reuse) the synthetic vectors here")
    parser.add_argument("--encode-sample", type=int, default=384, help="0 skips the encoding comparison")
    parser.add_argument("--skip-recall", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--out", default=None, help="write the raw numbers as JSON")
    parser.add_argument("--worker", choices=("baseline", "build", "search"), help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--vectors", help=argparse.SUPPRESS)
    parser.add_argument("--index", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    report: dict = {}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")

    if not args.skip_scale:
        # First, while this process is small: a child's ru_maxrss starts from what its parent had mapped
        # when it forked, so the workers must be started before torch and the encoder are loaded here.
        if args.workdir:  # kept, and its synthetic vectors reused by the next run
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            report["scale"] = scale_rows(
                args.scale_n, args.scale_kinds, workdir=Path(args.workdir), queries=args.queries
            )
        else:
            with tempfile.TemporaryDirectory(prefix="dense-scale-") as tmp:
                report["scale"] = scale_rows(
                    args.scale_n, args.scale_kinds, workdir=Path(tmp), queries=args.queries
                )
        save()
        print(f"## {args.scale_n:,} synthetic passages: memory (fresh process per step) and speed\n")
        print(scale_markdown(report["scale"], args.scale_n) + "\n", flush=True)
    if not args.skip_recall:
        from ragsuite.data.datasets import dataset_names, get_dataset_info

        names = args.datasets or [n for n in dataset_names() if get_dataset_info(n).has_corpus]
        report["recall"] = recall_rows(names, data_dir=args.data_dir, cache_dir=args.cache_dir)
        save()
        print("## recall@5 of gold passages, approximate vs exact (points in parentheses)\n")
        print(recall_markdown(report["recall"]) + "\n", flush=True)
    if args.encode_sample:
        report["encode"] = encode_row(args.encode_sample, data_dir=args.data_dir, cache_dir=args.cache_dir)
        save()
        e = report["encode"]
        print(f"## encoding {e['passages']} HotpotQA passages (best of 2)\n")
        print("| batches | passages/s |\n|---|---:|")
        for label, rate in e["passages_per_s"].items():
            print(f"| {label} | {rate:.1f} |")
        print(
            f"\nlength-sorted / corpus order: {e['speedup']:.2f}x; max |difference| {e['max_abs_diff']:.1e}"
        )
    print(f"\n{os.cpu_count()} CPU cores; faiss threads: default", file=sys.stderr)


if __name__ == "__main__":
    main()
