"""`ragsuite align build` and `align train` end to end: preference pairs from a local scripted server whose
judge choices are planted, and DPO on a tiny random causal LM built here (no weights are downloaded)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ragsuite.align.builder import SAMPLING_GRID, question_rng, sample_questions
from ragsuite.align.judge import judge_best_worst
from ragsuite.align.pairs import PreferencePair, parse_counts, select_pairs
from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.errors import ConfigError, install_hint
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer
from ragsuite.testing.responders import candidate_number, sampling_tag
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

DATASET = "2wikimultihopqa"
N = 3
#: The questions `--samples 3 --seed 0` draws.
EXAMPLES = sample_questions(load_dataset(DATASET), N, seed=0)
GOLD = {ex.question: ex.answers[0] for ex in EXAMPLES}
#: The question whose notes the judge cannot tell apart (same best and worst): no note_init pair.
TIED = EXAMPLES[0].question
BEST_NOTE, WORST_NOTE = "t0.5p0.5", "t0.9p0.1"
BEST_QUERIES, WORST_QUERIES = "t0.1p0.5", "t0.5p0.9"


def responder(request: ScriptedRequest) -> dict:
    """Every DeepNote/HANRAG stage, replies tagged with their sampling setting; the judge's picks planted."""
    fields = request.output_fields
    question = request.inputs.get("question", "")
    if "best" in fields and "notes" in request.inputs:
        if question == TIED:
            return {"best": 2, "worst": 2}
        notes = request.inputs["notes"]
        return {"best": candidate_number(notes, BEST_NOTE), "worst": candidate_number(notes, WORST_NOTE)}
    if "best" in fields:
        candidates = request.inputs["candidates"]
        return {
            "best": candidate_number(candidates, BEST_QUERIES),
            "worst": candidate_number(candidates, WORST_QUERIES),
        }
    if "better" in fields:  # NoteCompare: only the updates sampled at temperature 0.1 are better
        return {"better": "updated t0.1" in request.inputs["updated_note"]}
    if "note" in fields:
        return {"note": f"note {sampling_tag(request)}"}
    if "queries" in fields:
        return {"queries": [f"first query {sampling_tag(request)}", f"second query {sampling_tag(request)}"]}
    if "updated_note" in fields:
        return {"updated_note": f"updated {sampling_tag(request)}"}
    if "category" in fields:  # HANRAG's router: right (complex) only at temperature 0.1
        return {"category": "complex" if request.sampling["temperature"] == 0.1 else "single-step"}
    if "relevant" in fields:  # HANRAG's filter: says relevant only at temperature 0.1
        return {"relevant": request.sampling["temperature"] == 0.1}
    if "answer" in fields:  # exact at 0.1, containing the gold at 0.5, wrong at 0.9
        gold = GOLD.get(question, "unknown")
        temperature = request.sampling["temperature"]
        answer = {0.1: gold, 0.5: f"it is {gold} I think"}.get(temperature, f"wrong {sampling_tag(request)}")
        return {"answer": answer}
    raise AssertionError(f"unexpected request for {fields}")


@pytest.fixture(scope="module")
def build_args(align_build_args) -> Callable[..., list[str]]:
    """``build_args(server, out, *extra, program="deepnote")``: an ``align build`` of the N questions."""
    return functools.partial(align_build_args, samples=N, dataset=DATASET)


def records(out: Path) -> dict[str, dict]:
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["question"]: r for r in map(json.loads, lines)}


def pairs_of(record: dict, stage: str) -> list[PreferencePair]:
    return [PreferencePair.from_dict(p) for p in record["pairs"] if p["stage"] == stage]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_args) -> dict:
    """One DeepNote build over three questions, then a resume of it."""
    out = tmp_path_factory.mktemp("align") / "dnalign"
    with LocalOpenAIServer(responder) as server:
        code = main(build_args(server, out, "--counts", "answer=2"))
        requests = server.chat_requests
        again = main(build_args(server, out, "--counts", "answer=2"))
        resumed_requests = server.chat_requests - requests
    return {"out": out, "code": code, "again": again, "requests": requests, "resumed": resumed_requests}


def test_build_makes_the_planted_pairs_for_each_stage(built: dict) -> None:
    assert built["code"] == 0
    out = built["out"]
    by_question = records(out)
    assert set(by_question) == set(GOLD)
    for question, record in by_question.items():
        assert record["error"] is None
        assert record["top_k"] in (3, 5, 7)
        rng = question_rng(0, record["id"])
        assert rng.choice([3, 5, 7]) == record["top_k"]

        # D.4 task-oriented generation: an exact answer (t=0.1) against a wrong one (t=0.9), drawn at random.
        (answer,) = pairs_of(record, "answer")
        positives = [s for s in SAMPLING_GRID if s[0] == 0.1]
        negatives = [s for s in SAMPLING_GRID if s[0] == 0.9]
        assert answer.chosen_setting == rng.choice(positives)
        assert answer.rejected_setting == rng.choice(negatives)
        assert f"[[ ## answer ## ]]\n{GOLD[question]}\n" in answer.chosen
        assert "wrong t0.9" in answer.rejected
        assert question in answer.prompt[-1]["content"] and answer.prompt[0]["role"] == "system"

        # D.1 note initialization: the judge's best and worst of the nine, or nothing when it ties.
        inits = pairs_of(record, "note_init")
        if question == TIED:
            assert inits == [] and record["dropped"]["note_init"] == "judge gave the same best and worst"
            best_note = "note t0.9p0.9"  # no pair: the last note goes on, as the official script does
        else:
            (init,) = inits
            assert (init.chosen_setting, init.rejected_setting) == ((0.5, 0.5), (0.9, 0.1))
            assert "note t0.5p0.5" in init.chosen and "note t0.9p0.1" in init.rejected
            assert init.label == "judge"
            # The notes were written from the question's top-k passages, k drawn for this question.
            shown = init.prompt[-1]["content"]
            assert f'"[{record["top_k"]}] ' in shown and f'"[{record["top_k"] + 1}] ' not in shown
            best_note = "note t0.5p0.5"

        # D.2 query refinement: refined from the best initial note; judged.
        (refine,) = pairs_of(record, "query_refine")
        assert (refine.chosen_setting, refine.rejected_setting) == ((0.1, 0.5), (0.5, 0.9))
        assert best_note in refine.prompt[-1]["content"]
        assert "first query t0.1p0.5" in refine.chosen

        # D.3 knowledge accumulation: NoteCompare's verdict labels the updates; one of each at random.
        (update,) = pairs_of(record, "note_update")
        assert update.label == "note_compare"
        assert update.chosen_setting == rng.choice(positives)
        assert update.rejected_setting == rng.choice([s for s in SAMPLING_GRID if s[0] != 0.1])
        assert best_note in update.prompt[-1]["content"]
        assert "updated t0.1" in update.chosen and "updated t0.1" not in update.rejected


def test_build_selects_counts_writes_trl_rows_and_resumes(built: dict) -> None:
    out = built["out"]
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    stages = [row["stage"] for row in rows]
    # answer=2 of 3; the other stages keep DeepNote's defaults (1,900), so every pair: 2 + 3 + 3 + 2.
    assert sorted(stages) == sorted(
        ["answer"] * 2 + ["query_refine"] * 3 + ["note_update"] * 3 + ["note_init"] * 2
    )
    for row in rows:
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["chosen"][0]["role"] == "assistant" and row["rejected"][0]["role"] == "assistant"
        assert row["chosen"][0]["content"].rstrip().endswith("[[ ## completed ## ]]")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["stages"]["answer"] == {"available": 3, "asked": 2, "selected": 2}
    assert summary["stages"]["note_init"] == {"available": 2, "asked": 1900, "selected": 2}
    assert summary["short_of_counts"] and summary["complete"] is True
    # Per question: 9 answers, 9 notes + judge, 9 query sets + judge, 9 updates + 9 NoteCompare = 47 calls.
    assert summary["cost"]["lm_requests"] == 47 * N == built["requests"]
    assert summary["cost"]["retrievals"] == 2 * N
    assert summary["cost"]["input_tokens"] > 0 and summary["cost"]["output_tokens"] > 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["sampling"] == [list(s) for s in SAMPLING_GRID] and manifest["top_ks"] == [3, 5, 7]
    assert "factually correct" in manifest["judge_prompts"]["notes"]
    assert manifest["judge_lm"]["model"] == "openai/scripted" and manifest["counts"]["answer"] == 2
    # Rerunning the same command resumes: nothing is asked again and the same pairs come out.
    assert built["again"] == 0 and built["resumed"] == 0


def test_build_refuses_another_configuration_in_the_same_directory(built: dict, capsys, build_args) -> None:
    with LocalOpenAIServer(responder) as server:
        code = main(build_args(server, built["out"], "--top-k", "5"))
        assert server.chat_requests == 0
    assert code == 2
    assert "top_ks" in capsys.readouterr().err


def test_build_without_a_train_split_names_the_installed_splits_and_the_download(tmp_path, capsys) -> None:
    code = main(
        [
            "align",
            "build",
            "--program",
            "deepnote",
            "--dataset",
            DATASET,
            "--lm",
            "openai/x",
            "--judge-lm",
            "openai/y",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "no 'train' split installed (installed: dev)" in err
    assert "ragsuite data download 2wikimultihopqa --subset train" in err and "--questions FILE" in err


def test_a_failed_question_is_recorded_and_rebuilt_on_the_next_run(tmp_path, capsys, build_args) -> None:
    out = tmp_path / "faulty"
    failing = EXAMPLES[1].question

    def fault(number: int, request: ScriptedRequest) -> Fault | None:
        return Fault("server_error") if request.inputs.get("question") == failing else None

    with LocalOpenAIServer(responder, fault_fn=fault) as server:
        assert main(build_args(server, out)) == 1
    assert "1 question(s) failed" in capsys.readouterr().err
    failed = records(out)[failing]
    assert failed["error"] and failed["pairs"] == [] and "Internal server error" in failed["error"]["message"]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["questions"] == N - 1 and summary["errors"] == 1 and summary["complete"] is False
    with LocalOpenAIServer(responder) as server:
        assert main(build_args(server, out)) == 0
        assert server.chat_requests == 47  # the failed question only
    rebuilt = records(out)[failing]
    assert rebuilt["error"] is None and len(rebuilt["pairs"]) == 4


def test_deepnote_build_without_a_judge_says_to_pass_one(tmp_path, capsys, build_args) -> None:
    with LocalOpenAIServer(responder) as server:
        args = build_args(server, tmp_path / "o")
        at = args.index("--judge-lm")
        code = main(args[:at] + args[at + 4 :])
        assert server.chat_requests == 0
    assert code == 2 and "needs a judge LM: pass --judge-lm" in capsys.readouterr().err


def test_hanrag_recipe_labels_router_and_filter_with_the_dataset(tmp_path, build_args) -> None:
    out = tmp_path / "hanrag"
    with LocalOpenAIServer(responder) as server:
        code = main(build_args(server, out, program="hanrag"))
    assert code == 0
    for record in records(out).values():
        (route,) = pairs_of(record, "route")  # 2Wiki's types are multi-hop: the complex route is right
        assert route.chosen_setting[0] == 0.1 and route.rejected_setting[0] != 0.1
        assert "complex" in route.chosen and "single-step" in route.rejected
        filters = pairs_of(record, "filter")
        assert 1 <= len(filters) <= 2
        gold = set(EXAMPLES[[ex.question for ex in EXAMPLES].index(record["question"])].gold_passage_ids)
        for pair in filters:
            relevant_chosen = "True" in pair.chosen
            gold_passage = relevant_chosen == (pair.chosen_setting[0] == 0.1)
            assert gold_passage and relevant_chosen == ("True" not in pair.rejected)
        assert gold


def test_judge_best_worst_reads_numbers_and_refuses_ties_and_out_of_range() -> None:
    def judge(best: int, worst: int) -> ScriptedLM:
        return ScriptedLM(lambda request: {"best": best, "worst": worst})

    args = {"question": "q", "context": {"passages": ["[1] a | b"]}, "candidates": ["x", "y", "z"]}
    assert judge_best_worst("notes", judge(3, 1), **args) == (2, 0, None)
    # Without a valid, different worst the verdict names nothing (the official script's except branch).
    assert judge_best_worst("notes", judge(2, 2), **args) == (
        None,
        None,
        "judge gave the same best and worst",
    )
    assert judge_best_worst("notes", judge(4, 1), **args) == (None, None, "judge named no valid best")
    assert judge_best_worst("notes", judge(1, 0), **args) == (None, None, "judge named no valid worst")


def test_counts_parsing_and_seeded_selection() -> None:
    stages = ("note_init", "answer")
    assert parse_counts("note_init=5, answer=all", stages) == {"note_init": 5, "answer": None}
    for bad in ("route=3", "answer", "answer=-1", "answer=x"):
        with pytest.raises(ConfigError):
            parse_counts(bad, stages)
    pairs = [
        PreferencePair(
            stage=s,
            question_id=str(i),
            prompt=[{"role": "user", "content": "p"}],
            chosen="c",
            rejected="r",
            label="l",
        )
        for s in stages
        for i in range(10)
    ]
    picked, report = select_pairs(pairs, {"note_init": 4, "answer": None}, seed=3)
    assert report == {
        "answer": {"available": 10, "asked": None, "selected": 10},
        "note_init": {"available": 10, "asked": 4, "selected": 4},
    }
    again, _ = select_pairs(list(reversed(pairs)), {"note_init": 4, "answer": None}, seed=3)
    assert [(p.stage, p.question_id) for p in picked] == [(p.stage, p.question_id) for p in again]


def test_train_without_the_extra_names_the_install_command(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ImportError
    code = main(["align", "train", str(tmp_path), "--model", "m", "--out", str(tmp_path / "m")])
    assert code == 2
    # From a clone: "pip install -e '.[train]' (from the ragsuite clone)"; from an index: the package's.
    assert install_hint("train") in capsys.readouterr().err


# ---------------------------------------------------------------------------- training
def tiny_model(rows: list[dict], path: Path, *, dtype: str = "float32") -> None:
    """A word-level tokenizer over the pairs' words with a chat template, and a 2-layer random Llama saved in
    ``dtype`` (released instruct models are bfloat16 checkpoints)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [m["content"] for row in rows for key in ("prompt", "chosen", "rejected") for m in row[key]]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    import torch

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(path)
    fast.save_pretrained(path)


def built_rows(built: dict) -> list[dict]:
    return [
        json.loads(line) for line in (built["out"] / "train.jsonl").read_text(encoding="utf-8").splitlines()
    ]


def train(built: dict, base: Path, out: Path, *options: str, dtype: str = "float32") -> int:
    """``align train`` on the built pairs, from a tiny model saved at ``base`` in ``dtype``, writing to
    ``out``: its exit code."""
    tiny_model(built_rows(built), base, dtype=dtype)
    return main(["align", "train", str(built["out"]), "--model", str(base), "--out", str(out), *options])


def test_train_dpo_on_the_built_pairs_lowers_the_loss_and_saves_a_loadable_model(
    built: dict, tmp_path
) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install -e '.[train]'")
    pytest.importorskip("peft", reason="needs the train extra: pip install -e '.[train]'")
    import torch
    from transformers import AutoModelForCausalLM

    rows = built_rows(built)
    base, out = tmp_path / "base", tmp_path / "trained"
    options = ["--learning-rate", "5e-3", "--batch-size", "4", "--per-device-batch-size", "2"]
    assert train(built, base, out, *options, "--max-steps", "6", "--max-length", "2048") == 0
    record = json.loads((out / "align_train.json").read_text(encoding="utf-8"))
    losses = record["losses"]
    assert (
        record["steps"] == 6 and record["gradient_accumulation_steps"] == 2 and record["pairs"] == len(rows)
    )
    assert abs(losses[0] - 0.6931) < 1e-3  # policy == reference at the first step: log 2
    assert losses[-1] < losses[0] - 0.05
    trained = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(base)
    changed = [
        name
        for (name, a), (_, b) in zip(trained.named_parameters(), reference.named_parameters(), strict=True)
        if not torch.equal(a, b)
    ]
    assert changed


def test_train_with_lora_saves_a_merged_model(built: dict, tmp_path) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install -e '.[train]'")
    pytest.importorskip("peft", reason="needs the train extra: pip install -e '.[train]'")
    from transformers import AutoModelForCausalLM

    base, out = tmp_path / "base", tmp_path / "lora"
    options = ["--lora", "--learning-rate", "1e-2", "--batch-size", "2", "--per-device-batch-size", "2"]
    options += ["--max-steps", "4", "--max-length", "2048", "--stages", "answer,note_init"]
    assert train(built, base, out, *options) == 0
    record = json.loads((out / "align_train.json").read_text(encoding="utf-8"))
    assert record["stages"] == ["answer", "note_init"] and record["pairs"] == 4
    assert record["losses"][-1] < record["losses"][0]
    model = AutoModelForCausalLM.from_pretrained(out)  # merged: a plain model, no adapter files needed
    assert not (out / "adapter_config.json").exists() and type(model).__name__ == "LlamaForCausalLM"


def changed_share(trained, reference, *, only: str = "") -> float:
    """The share of weight entries that differ between two models of the same architecture (of the
    parameters whose name contains ``only``)."""
    changed = total = 0
    for (name, a), (_, b) in zip(trained.named_parameters(), reference.named_parameters(), strict=True):
        if only in name:
            changed += int((a.detach().float() != b.detach().float()).sum())
            total += a.numel()
    return changed / total


def test_bf16_trains_float32_weights_under_autocast_and_the_paper_s_lr_moves_them(
    built: dict, tmp_path, monkeypatch
) -> None:
    """``--bf16`` is mixed precision: the matmuls run in bfloat16 (autocast) while the weights the optimizer
    updates stay float32. Trained in bfloat16 itself, the paper's lr 5e-7 rounds nearly every update away."""
    pytest.importorskip("trl", reason="needs the train extra: pip install -e '.[train]'")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    from ragsuite.align.trainer import DPOSettings

    assert DPOSettings().effective_learning_rate == 5e-7  # the paper's
    seen: list[tuple[torch.dtype, torch.dtype]] = []  # (weight dtype, output dtype) of each MLP call
    forward = modeling_llama.LlamaMLP.forward

    def watched(self, x):
        output = forward(self, x)
        seen.append((self.down_proj.weight.dtype, output.dtype))
        return output

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", watched)
    base, out = tmp_path / "base", tmp_path / "trained"
    options = ["--bf16", "--batch-size", "2", "--per-device-batch-size", "2", "--max-steps", "4"]
    assert train(built, base, out, *options, "--max-length", "2048", dtype="bfloat16") == 0  # the default lr
    assert seen and {weight for weight, _ in seen} == {torch.float32}  # master weights stay float32
    assert torch.bfloat16 in {output for _, output in seen}  # and the compute ran in bfloat16
    record = json.loads((out / "align_train.json").read_text(encoding="utf-8"))
    assert record["bf16"] is True and record["weights_dtype"] == "float32" and record["steps"] == 4
    assert record["settings"]["learning_rate"] == 5e-7
    trained = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    # From a bfloat16 checkpoint, 4 steps at lr 5e-7 move nearly every weight; trained in bfloat16 itself,
    # about 1% of them moved.
    share = changed_share(trained, AutoModelForCausalLM.from_pretrained(base, dtype="auto"))
    assert share > 0.9, share


def test_a_half_precision_model_is_refused_for_full_training(built: dict, tmp_path) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install -e '.[train]'")
    import torch
    from transformers import AutoModelForCausalLM

    from ragsuite.align.trainer import DPOSettings, train_dpo

    base = tmp_path / "base"
    tiny_model(built_rows(built), base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match=r"bfloat16 weights.*float32.*--bf16"):
        train_dpo(built["out"], model=model, out=tmp_path / "out", settings=DPOSettings(max_steps=1))
    assert not (tmp_path / "out").exists()


def test_lora_has_its_own_default_lr_and_it_moves_the_merged_weights(built: dict, tmp_path) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install -e '.[train]'")
    pytest.importorskip("peft", reason="needs the train extra: pip install -e '.[train]'")
    from transformers import AutoModelForCausalLM

    from ragsuite.align.trainer import LORA_LEARNING_RATE, DPOSettings

    assert DPOSettings(lora=True).effective_learning_rate == LORA_LEARNING_RATE > 5e-7
    assert DPOSettings(lora=True, learning_rate=1e-4).effective_learning_rate == 1e-4
    base, out = tmp_path / "base", tmp_path / "lora"
    options = ["--lora", "--bf16", "--batch-size", "2", "--per-device-batch-size", "2", "--max-steps", "3"]
    assert train(built, base, out, *options, "--max-length", "2048") == 0
    record = json.loads((out / "align_train.json").read_text(encoding="utf-8"))
    assert record["settings"]["learning_rate"] == LORA_LEARNING_RATE and record["weights_dtype"] == "float32"
    trained = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    # LoRA adapts the attention and MLP projections; merged, trained at its default lr, they moved.
    share = changed_share(trained, AutoModelForCausalLM.from_pretrained(base), only="_proj.")
    assert share > 0.9, share
