"""Test doubles for running programs without a real LM: a scripted in-process LM (and, in
:mod:`ragsuite.testing.openai_server`, a local OpenAI-compatible HTTP server; in :mod:`ragsuite.testing.toys`,
a toy program with a known optimum for testing optimizers). Used by the test-suite and the benchmarks; handy
for users who want to unit-test their own compositions."""

from ragsuite.testing.scripted import (
    Reply,
    ScriptedLM,
    ScriptedRequest,
    TokenLogprob,
    format_chat_reply,
    parse_chat_messages,
)

__all__ = [
    "Reply",
    "ScriptedLM",
    "ScriptedRequest",
    "TokenLogprob",
    "format_chat_reply",
    "parse_chat_messages",
]
