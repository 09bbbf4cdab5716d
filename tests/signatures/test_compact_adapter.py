"""The compact prompt for schema-holding LMs: the instruction, one line of output fields, labelled inputs."""

from __future__ import annotations

import json

import dspy
import pytest

from ragsuite.signatures.compact import CompactJSONAdapter
from ragsuite.signatures.deepnote import NoteCompare, NoteInit, NoteUpdate, QueryRefine

INPUTS = {
    "question": "Which band released Counterparts?",
    "passages": ["[1] Rush | Rush is a Canadian rock band.", '[2] Counterparts | An album by "Rush".'],
    "best_note": "Rush is a Canadian rock band.",
    "updated_note": "Rush, a Canadian rock band, released Counterparts.",
    "asked_queries": ["Who released Counterparts?"],
}


def _text(messages: list[dict[str, str]]) -> str:
    return "\n".join(message["content"] for message in messages)


def _inputs(signature: type[dspy.Signature]) -> dict[str, object]:
    return {name: value for name, value in INPUTS.items() if name in signature.input_fields}


def test_the_prompt_is_the_instruction_the_fields_and_the_labelled_inputs() -> None:
    system, user = CompactJSONAdapter().format(NoteUpdate, [], _inputs(NoteUpdate))
    assert system["role"] == "system" and user["role"] == "user"
    assert system["content"].startswith("Update the note with the newly retrieved passages.")
    assert system["content"].endswith(
        'Reply with a JSON object: {"updated_note": "..." (the note with the new useful content added)}'
    )
    # Passages one per line as written, not a JSON array with escaped quotes; no format tutorial.
    assert "Passages (newly retrieved passages, '[i] title | text'):\n[1] Rush | Rush is" in user["content"]
    assert '[2] Counterparts | An album by "Rush".' in user["content"]
    assert user["content"].startswith("Question:\nWhich band released Counterparts?")
    assert "[[ ##" not in _text([system, user]) and "Respond with" not in _text([system, user])


def test_output_types_are_named_in_words() -> None:
    (system, _) = CompactJSONAdapter().format(QueryRefine, [], _inputs(QueryRefine))
    assert '"queries": ["...", ...] (exactly two new questions)' in system["content"]
    (system, _) = CompactJSONAdapter().format(NoteCompare, [], _inputs(NoteCompare))
    assert '"better": true or false' in system["content"]
    (_, user) = CompactJSONAdapter().format(QueryRefine, [], {**_inputs(QueryRefine), "asked_queries": []})
    assert "Asked queries (questions already asked; do not repeat them):\n(none)" in user["content"]


@pytest.mark.parametrize("signature", [NoteInit, QueryRefine, NoteUpdate, NoteCompare])
def test_the_prompt_is_much_shorter_than_dspys_json_adapter(signature: type[dspy.Signature]) -> None:
    """What the compact prompt drops is the format tutorial: at least 40% of DSPy's JSON adapter's prompt for
    the same inputs (these inputs are short, so the fixed part dominates)."""
    compact = len(_text(CompactJSONAdapter().format(signature, [], _inputs(signature))))
    dspy_json = len(_text(dspy.JSONAdapter().format(signature, [], _inputs(signature))))
    assert compact < 0.6 * dspy_json


def test_demos_reach_the_prompt_as_turns_and_replies_parse_as_json() -> None:
    demo = dspy.Example(**_inputs(NoteCompare), better=True)
    messages = CompactJSONAdapter().format(NoteCompare, [demo], _inputs(NoteCompare))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == messages[3]["content"]  # the demo's inputs, labelled the same way
    assert '"better": true' in messages[2]["content"]
    assert CompactJSONAdapter().parse(NoteCompare, '{"better": false}') == {"better": False}
    assert CompactJSONAdapter().parse(QueryRefine, '{"queries": ["a", "b"]}') == {"queries": ["a", "b"]}


def test_a_scripted_run_parses_through_the_compact_adapter() -> None:
    from dspy.utils.dummies import DummyLM

    lm = DummyLM([{"note": "Rush is a Canadian rock band."}], adapter=CompactJSONAdapter())
    with dspy.context(lm=lm, adapter=CompactJSONAdapter()):
        prediction = dspy.Predict(NoteInit)(**_inputs(NoteInit))
    assert prediction.note == "Rush is a Canadian rock band."
    sent = _text(lm.history[-1]["messages"])
    assert "Reply with a JSON object" in sent and "[[ ##" not in sent


def test_a_schema_holding_lm_is_held_to_the_signature_s_reply_bounds(reply_schema) -> None:
    """QueryRefine's reply schema asks for at most two queries of at most 500 characters each (what retrieval
    reads); parsing stays as lenient as DSPy's, so an LM without a grammar is not refused for a long one."""
    schema = reply_schema(QueryRefine)
    assert schema["properties"]["queries"]["maxItems"] == 2
    assert schema["properties"]["queries"]["items"] == {"type": "string", "maxLength": 500}
    # A note is bounded too (a model repeating itself ends as valid JSON).
    assert reply_schema(NoteInit)["properties"]["note"]["maxLength"] == 2000
    # A signature without bounds keeps DSPy's schema.
    assert "maxLength" not in json.dumps(reply_schema(NoteCompare))
    long_query = "x" * 600
    assert CompactJSONAdapter().parse(QueryRefine, json.dumps({"queries": [long_query]})) == {
        "queries": [long_query]
    }


def test_reply_bounds_survive_an_instruction_rewrite_and_a_saved_program(tmp_path) -> None:
    """DSPy rebuilds a signature as a new class when an optimizer rewrites its instructions and when a saved
    program is loaded; the bounds must come along, or a compiled DeepNote's notes ramble to the token limit
    (a loaded program file once wrote a 5,741-character note)."""
    import ragsuite
    from ragsuite import programs
    from ragsuite.signatures.compact import reply_bounds
    from ragsuite.testing.retrievers import ListRetriever

    rewritten = NoteInit.with_instructions("Write a short note.")
    assert reply_bounds(rewritten.output_fields["note"]) == {"maxLength": 2000}
    program = programs.get("deepnote")(retriever=ListRetriever([]))
    program.note_update.signature = program.note_update.signature.with_instructions("Update the note.")
    program.save(str(tmp_path / "deepnote.json"))
    loaded = ragsuite.load(str(tmp_path / "deepnote.json"), retriever=ListRetriever([]))
    bounds = {
        name: {field: reply_bounds(info) for field, info in predictor.signature.output_fields.items()}
        for name, predictor in loaded.named_predictors()
    }
    assert bounds["note_init"]["note"] == bounds["note_update"]["updated_note"] == {"maxLength": 2000}
    assert bounds["query_refine"]["queries"] == {"maxItems": 2, "items": {"maxLength": 500}}
    assert "Update the note." in loaded.note_update.signature.instructions
