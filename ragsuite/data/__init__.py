"""Datasets (loaders for our JSONL layout and readers for the public originals) and the papers' metrics."""

from ragsuite.data.datasets import (
    DATASETS,
    DatasetInfo,
    dataset_names,
    get_dataset_info,
    load_corpus,
    load_corpus_file,
    load_dataset,
    load_examples_file,
    write_jsonl,
)
from ragsuite.data.metrics import metric_for, score_example

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "dataset_names",
    "get_dataset_info",
    "load_corpus",
    "load_corpus_file",
    "load_dataset",
    "load_examples_file",
    "metric_for",
    "score_example",
    "write_jsonl",
]
