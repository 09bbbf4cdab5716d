"""BM25 at paper scale: ragsuite's on-disk index against plain bm25s, synthetic corpora of 100k-21M passages.

    python benchmarks/scale.py [--sizes 100k,1M,5M] [--bm25s-up-to 1M] [--queries 300] [--work DIR]
                               [--out results.json] [--keep]

For each size, a deterministic synthetic corpus with the word statistics of the dev passages is written once
(``benchmarks/synthetic_corpus.py``), then every measurement runs in a fresh child process, so that peak
memory is the child's own (``os.wait4``'s ``ru_maxrss``, the OS's accounting) and nothing is warm from an
earlier step:

* **build**: wall time and peak RSS of ``BM25Retriever.from_file`` (a fresh build, the corpus sha256
  included), and the index size on disk; plain bm25s: ``bm25s.tokenize`` + ``BM25.index`` + ``save``, the
  reference configuration of ``benchmarks/retrieval.py``;
* **open**: wall time and RSS of a fresh process opening the built index (bm25s: ``BM25.load(mmap=True)``);
* **query**: latency p50/p99 of one-by-one queries (real HotpotQA dev questions; the first query, which
  compiles the kernel or warms the maps, is reported apart), and batched throughput (one call for all queries,
  tokenizing included, with as many threads for every engine: one per CPU; the median of ``--batch-repeats``
  calls after a warm-up call, fewer when they take over 20 s together); ragsuite with its compiled kernel
  (numba) and its NumPy fallback, bm25s with its numpy backend one by one and its numba backend batched.
  A bm25s batch returns passage numbers; ragsuite's batches are timed both returning ids (``batch_ids``, the
  like-for-like call) and returning whole passages (``batch``, title and text read from the passage store).
  RSS after querying is reported with its anonymous part: the rest is file pages of the memory-mapped index,
  which the OS can drop.

The last table fits build time and peak RSS linearly in the passage count (least squares over the sizes run)
and extrapolates to 5.2M (HotpotQA abstracts) and 21M (Wikipedia 2018) passages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic_corpus import parse_count, write_corpus  # noqa: E402

K = 10
# The parent passes --data-dir to the child processes as RAGSUITE_DATA.
FIXTURES = ROOT / "tests" / "fixtures" / "data"


def questions(limit: int) -> list[str]:
    path = Path(os.environ.get("RAGSUITE_DATA") or FIXTURES) / "hotpotqa" / "dev.jsonl"
    if not path.is_file():
        raise SystemExit(f"no {path}; pass --data-dir")
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line)["question"] for line in handle if line.strip()]
    return (rows * (limit // len(rows) + 1))[:limit]


def memory_now() -> dict[str, float]:
    """VmRSS and its anonymous part, MiB, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                fields[name] = int(value.split()[0]) / 1024
    return {"rss_mib": fields.get("VmRSS", 0.0), "anon_mib": fields.get("RssAnon", 0.0)}


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- children: one measurement each, printing one JSON line ----------------------------------------------


def child_build_ragsuite(corpus: str, cache: str) -> dict:
    from ragsuite.retrieval.bm25 import BM25Retriever

    started = time.perf_counter()
    retriever = BM25Retriever.from_file(corpus, cache_dir=cache)
    seconds = time.perf_counter() - started
    assert retriever.index_built and retriever.index_dir is not None
    meta = retriever._index.meta
    return {
        "seconds": seconds,
        "index_bytes": dir_size(retriever.index_dir),
        "terms": meta["num_terms"],
        "postings": meta["num_postings"],
    }


def child_build_bm25s(corpus: str, out: str) -> dict:
    import bm25s
    import Stemmer

    started = time.perf_counter()
    with open(corpus, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    texts = [f"{r['title']} {r['text']}" for r in rows]
    del rows
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
    del texts
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    retriever.save(out)
    return {"seconds": time.perf_counter() - started, "index_bytes": dir_size(Path(out))}


def _latencies(search, queries: list[str]) -> dict:
    started = time.perf_counter()
    search(queries[0])
    first = time.perf_counter() - started
    times = []
    for q in queries[1:]:
        started = time.perf_counter()
        search(q)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "first_ms": first * 1000,
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1000,
    }


def _batch_qps(run, n_queries: int, repeats: int, budget: float = 20.0) -> float:
    """Queries per second of ``run()`` (one batch of ``n_queries``): the median over ``repeats`` calls made
    after one warm-up call, or over those that fit in ``budget`` seconds (at least one). A batch of a few
    hundred small queries takes tens of milliseconds, where one call's timing is mostly scheduling noise;
    a slow batch (the NumPy kernel at 5M) needs no more calls than the budget allows."""
    run()
    seconds: list[float] = []
    while len(seconds) < repeats and (not seconds or sum(seconds) < budget):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return n_queries / statistics.median(seconds)


def child_query_ragsuite(corpus: str, cache: str, n_queries: str, kernel: str, repeats: str) -> dict:
    os.environ["RAGSUITE_BM25_KERNEL"] = kernel
    started = time.perf_counter()
    from ragsuite.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.from_file(corpus, cache_dir=cache)
    open_seconds = time.perf_counter() - started
    assert not retriever.index_built
    after_open = memory_now()
    queries = questions(int(n_queries))
    single = _latencies(lambda q: retriever(q, K), queries)
    batch_qps = _batch_qps(lambda: retriever.batch(queries, K), len(queries), int(repeats))
    batch_ids_qps = _batch_qps(lambda: retriever.batch_ids(queries, K), len(queries), int(repeats))
    return {
        "open_seconds": open_seconds,
        "open": after_open,
        "single": single,
        "batch_qps": batch_qps,
        "batch_ids_qps": batch_ids_qps,
        "after": memory_now(),
    }


def child_query_bm25s(index: str, n_queries: str, repeats: str) -> dict:
    started = time.perf_counter()
    import bm25s
    import Stemmer

    retriever = bm25s.BM25.load(index, mmap=True)
    open_seconds = time.perf_counter() - started
    after_open = memory_now()
    stemmer = Stemmer.Stemmer("english")
    queries = questions(int(n_queries))

    def one(q: str):
        tokens = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False)
        return retriever.retrieve(tokens, k=K, show_progress=False)

    single = _latencies(one, queries)
    result = {"open_seconds": open_seconds, "open": after_open, "single": single}

    def batch() -> None:
        tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
        retriever.retrieve(tokens, k=K, show_progress=False, n_threads=os.cpu_count() or 1)

    for backend in ("numpy", "numba"):
        retriever.backend = backend  # the warm-up call compiles the numba backend
        result[f"batch_qps_{backend}"] = _batch_qps(batch, len(queries), int(repeats))
    result["after"] = memory_now()
    return result


def _ragsuite_tokenizer():
    """ragsuite's BM25 analysis (title weighting, accent folding, stopwords, stemming) as text -> stems."""
    from ragsuite.retrieval.base import Passage
    from ragsuite.retrieval.bm25 import BM25Retriever

    probe = BM25Retriever([Passage("p", "", "probe")], persist=False)
    return lambda row: probe._tokenize(probe._document(Passage(row["id"], row["title"], row["text"])))


def child_build_tantivy(corpus: str, out: str) -> dict:
    """tantivy over ragsuite's own stems (so both index the same terms), its writer memory capped at 1 GiB."""
    import tantivy

    analyze = _ragsuite_tokenizer()
    started = time.perf_counter()
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body", tokenizer_name="whitespace", index_option="freq")
    builder.add_unsigned_field("n", stored=True)
    Path(out).mkdir(parents=True)
    index = tantivy.Index(builder.build(), path=out)
    writer = index.writer(heap_size=1 << 30, num_threads=1)
    with open(corpus, encoding="utf-8") as handle:
        for n, line in enumerate(handle):
            writer.add_document(tantivy.Document(body=" ".join(analyze(json.loads(line))), n=n))
    writer.commit()
    writer.wait_merging_threads()
    return {"seconds": time.perf_counter() - started, "index_bytes": dir_size(Path(out))}


def child_query_tantivy(index_dir: str, corpus: str, cache: str, n_queries: str, repeats: str) -> dict:
    """tantivy's BM25 (k1 = 1.2, b = 0.75, fixed) one by one and on a thread per core; overlap@10 with
    ragsuite's top 10 measures how close its ranking is."""
    from concurrent.futures import ThreadPoolExecutor

    import tantivy

    from ragsuite.retrieval.bm25 import BM25Retriever

    started = time.perf_counter()
    index = tantivy.Index.open(index_dir)
    searcher = index.searcher()
    open_seconds = time.perf_counter() - started
    after_open = memory_now()
    ours = BM25Retriever.from_file(corpus, cache_dir=cache)
    queries = questions(int(n_queries))

    def one(q: str) -> list[int]:
        stems = ours._tokenize(q)
        if not stems:
            return []
        query = index.parse_query(" ".join(stems), ["body"])
        return [searcher.doc(address)["n"][0] for _, address in searcher.search(query, K).hits]

    single = _latencies(one, queries)
    ranked: list[list[int]] = []

    def batch() -> None:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            ranked[:] = pool.map(one, queries)

    batch_qps = _batch_qps(batch, len(queries), int(repeats))
    overlap = []
    for q, theirs in zip(queries, ranked, strict=True):
        mine = {int(p.id[1:]) for p in ours(q, K)}  # synthetic ids are "s<passage number>"
        overlap.append(len(mine & set(theirs)) / max(1, len(mine)))
    return {
        "open_seconds": open_seconds,
        "open": after_open,
        "single": single,
        "batch_qps": batch_qps,
        "overlap_at_10": statistics.fmean(overlap),
        "after": memory_now(),
    }


CHILDREN = {
    "build-tantivy": child_build_tantivy,
    "query-tantivy": child_query_tantivy,
    "build-ragsuite": child_build_ragsuite,
    "build-bm25s": child_build_bm25s,
    "query-ragsuite": child_query_ragsuite,
    "query-bm25s": child_query_bm25s,
}


def run_child(kind: str, *args: str) -> dict:
    """Run one measurement in a fresh process; its JSON result plus its peak RSS (MiB) from wait4."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", kind, *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{kind} {' '.join(args)} failed with exit code {process.returncode}")
    result = json.loads(output.strip().splitlines()[-1])
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def median_of(runs: list[dict]) -> dict:
    """Field by field median of several runs' results (nested dicts of numbers)."""
    first = runs[0]
    if isinstance(first, dict):
        return {key: median_of([run[key] for run in runs]) for key in first}
    return statistics.median(runs)


# -- the table ----------------------------------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``."""
    if len(xs) < 2:
        return 0.0, ys[0] / xs[0]
    b = statistics.covariance(xs, ys) / statistics.variance(xs)
    return statistics.fmean(ys) - b * statistics.fmean(xs), b


def human(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def _build_cell(build: dict | None) -> str:
    if not build:
        return "–"
    return (
        f"{build['seconds']:.0f} s, {build['peak_rss_mib'] / 1024:.2f} GiB, "
        f"{build['index_bytes'] / 2**20:,.0f} MiB"
    )


def _latency_cell(query: dict | None) -> str:
    return f"{query['single']['p50_ms']:.1f} / {query['single']['p99_ms']:.1f}" if query else "–"


def print_tables(results: list[dict]) -> None:
    print("\n## Build: time, peak RSS, index size on disk")
    print("| passages | ragsuite | plain bm25s | tantivy (ragsuite's stems) | peak RSS ragsuite / bm25s |")
    print("|---|---|---|---|---|")
    for r in results:
        ref = r.get("bm25s_build")
        ratio = f"{r['build']['peak_rss_mib'] / ref['peak_rss_mib']:.2f}x" if ref else "–"
        print(
            f"| {human(r['n'])} | {_build_cell(r['build'])} | {_build_cell(ref)} "
            f"| {_build_cell(r.get('tantivy_build'))} | {ratio} |"
        )
    print("\n## Open a built index in a fresh process: time, RSS")
    print("| passages | ragsuite | plain bm25s (mmap) | tantivy |")
    print("|---|---|---|---|")
    for r in results:
        cells = []
        for q in (
            r["query"].get("numba") or r["query"]["numpy"],
            r.get("bm25s_query"),
            r.get("tantivy_query"),
        ):
            cells.append(f"{q['open_seconds']:.3f} s, {q['open']['rss_mib']:.0f} MiB" if q else "–")
        print(f"| {human(r['n'])} | {' | '.join(cells)} |")
    print(f"\n## Queries one by one (k={K}): p50 / p99 ms")
    print(
        "| passages | ragsuite (numba kernel) | ragsuite (NumPy kernel) | plain bm25s (numpy) | tantivy "
        "| tantivy overlap@10 with ragsuite |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        tantivy = r.get("tantivy_query")
        overlap = f"{tantivy['overlap_at_10']:.2f}" if tantivy else "–"
        print(
            f"| {human(r['n'])} | {_latency_cell(r['query'].get('numba'))} "
            f"| {_latency_cell(r['query'].get('numpy'))} | {_latency_cell(r.get('bm25s_query'))} "
            f"| {_latency_cell(tantivy)} | {overlap} |"
        )
    print(
        f"\n## Batched queries on every core ({os.cpu_count()} threads each: ragsuite's batch() runs a "
        f"thread per CPU, bm25s' retrieve gets n_threads={os.cpu_count()}): queries/s; memory after querying"
    )
    print(
        "| passages | ragsuite ids (numba) | ragsuite ids / bm25s numba | ragsuite passages (numba) "
        "| ragsuite passages / bm25s numba | ragsuite passages (NumPy) | bm25s numba backend "
        "| tantivy (a thread per core) | ragsuite RSS after, of which anonymous |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        fast, slow = r["query"].get("numba"), r["query"].get("numpy")
        ref, tantivy = r.get("bm25s_query"), r.get("tantivy_query")
        ours = fast or slow
        cells = [
            f"{fast['batch_ids_qps']:.0f}" if fast else "–",
            f"{fast['batch_ids_qps'] / ref['batch_qps_numba']:.2f}x" if fast and ref else "–",
            f"{fast['batch_qps']:.0f}" if fast else "–",
            f"{fast['batch_qps'] / ref['batch_qps_numba']:.2f}x" if fast and ref else "–",
            f"{slow['batch_qps']:.0f}" if slow else "–",
            f"{ref['batch_qps_numba']:.0f}" if ref else "–",
            f"{tantivy['batch_qps']:.0f}" if tantivy else "–",
            f"{ours['after']['rss_mib']:.0f} MiB, {ours['after']['anon_mib']:.0f} MiB",
        ]
        print(f"| {human(r['n'])} | {' | '.join(cells)} |")
    xs = [float(r["n"]) for r in results]
    if len(xs) >= 2:
        print("\n## Fitted growth (least squares over the sizes above; ragsuite build)")
        print("| passages | build time | build peak RSS |")
        print("|---|---|---|")
        a_t, b_t = fit_line(xs, [r["build"]["seconds"] for r in results])
        a_m, b_m = fit_line(xs, [r["build"]["peak_rss_mib"] for r in results])
        for n in (5_200_000, 21_015_324):
            print(f"| {n / 1e6:.1f}M | {(a_t + b_t * n) / 60:.0f} min | {(a_m + b_m * n) / 1024:.1f} GiB |")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(CHILDREN[argv[1]](*argv[2:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default="100k,1M,5M", help="comma-separated passage counts (100k, 1M, ...)"
    )
    parser.add_argument(
        "--bm25s-up-to", type=parse_count, default=1_000_000, help="largest size bm25s builds"
    )
    parser.add_argument(
        "--tantivy-up-to", type=parse_count, default=5_000_000, help="largest size tantivy builds"
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="alternating query runs per engine (median)")
    parser.add_argument(
        "--batch-repeats",
        type=int,
        default=5,
        help="timed batch calls per query run (their median, after a warm-up call; fewer when they "
        "take over 20 s together)",
    )
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/ragsuite/bench-scale")
    parser.add_argument("--out", type=Path, help="also write the raw results as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the built indexes (corpora are always kept)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=FIXTURES,
        help="datasets: the corpora's word statistics and HotpotQA's dev questions (default: the fixtures)",
    )
    args = parser.parse_args(argv)
    os.environ["RAGSUITE_DATA"] = str(args.data_dir.resolve())
    sizes = [parse_count(s) for s in args.sizes.split(",")]
    results = []
    for n in sizes:
        corpus = write_corpus(n, args.work / f"synthetic-{human(n)}.jsonl", data_dir=args.data_dir)
        cache, bm25s_dir, tantivy_dir = (
            args.work / f"{kind}-{human(n)}" for kind in ("cache", "bm25s", "tantivy")
        )
        for directory in (cache, bm25s_dir, tantivy_dir):
            shutil.rmtree(directory, ignore_errors=True)
        print(f"[{human(n)}] builds ...", file=sys.stderr, flush=True)
        row: dict = {"n": n, "build": run_child("build-ragsuite", str(corpus), str(cache))}
        repeats = str(args.batch_repeats)
        queries: dict[str, list[str]] = {
            kernel: ["query-ragsuite", str(corpus), str(cache), str(args.queries), kernel, repeats]
            for kernel in ("numba", "numpy")
        }
        if n <= args.bm25s_up_to:
            row["bm25s_build"] = run_child("build-bm25s", str(corpus), str(bm25s_dir))
            queries["bm25s"] = ["query-bm25s", str(bm25s_dir), str(args.queries), repeats]
        if n <= args.tantivy_up_to:
            row["tantivy_build"] = run_child("build-tantivy", str(corpus), str(tantivy_dir))
            queries["tantivy"] = [
                "query-tantivy",
                str(tantivy_dir),
                str(corpus),
                str(cache),
                str(args.queries),
                repeats,
            ]
        # Query runs alternate between the engines, round after round, and each figure is the median over
        # rounds: load from other processes then falls on every engine alike.
        rounds: dict[str, list[dict]] = {name: [] for name in queries}
        for round_number in range(args.rounds):
            print(
                f"[{human(n)}] queries, round {round_number + 1}/{args.rounds} ...",
                file=sys.stderr,
                flush=True,
            )
            for name, child in queries.items():
                rounds[name].append(run_child(*child))
        medians = {name: median_of(runs) for name, runs in rounds.items()}
        row["query"] = {"numba": medians["numba"], "numpy": medians["numpy"]}
        if "bm25s" in medians:
            row["bm25s_query"] = medians["bm25s"]
        if "tantivy" in medians:
            row["tantivy_query"] = medians["tantivy"]
        if not args.keep:
            for directory in (cache, bm25s_dir, tantivy_dir):
                shutil.rmtree(directory, ignore_errors=True)
        results.append(row)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"\nscale benchmark: {os.cpu_count()} CPUs; peak RSS from wait4 (ru_maxrss) of each child process")
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
