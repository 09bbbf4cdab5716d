"""Datasets (loaders for our JSONL layout and readers for the public originals) and the papers' metrics."""

from ragsuite.data.datasets import (
    DATASETS,
    DatasetInfo,
    dataset_names,
    get_dataset_info,
    load_corpus,
    load_corpus_file,
    load_dataset,
)

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "dataset_names",
    "get_dataset_info",
    "load_corpus",
    "load_corpus_file",
    "load_dataset",
]
