"""Placeholder until the command is implemented."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    del subparsers
