"""DPO training of a stage model on preference pairs (DeepNote §3.5), with TRL's ``DPOTrainer``.

The defaults are the paper's: learning rate 5e-7, beta 0.1, one epoch, batch size 8 (the official
``train.sh``: one pair per device on 8 GPUs; here ``batch_size`` is the effective batch, reached by gradient
accumulation over ``per_device_batch_size``), sigmoid DPO loss, the reference model frozen. The paper trains
all parameters; ``lora=True`` trains a LoRA adapter through peft instead (one GPU for an 8B model) and, by
default, merges it into the saved model so that ``ragsuite serve`` (vLLM) serves it like any other model.
A LoRA adapter starts at zero and is scaled down by ``lora_alpha / r``, so its default learning rate is its
own, :data:`LORA_LEARNING_RATE` (5e-6, the Hugging Face alignment handbook's LoRA DPO recipe), not 5e-7.

Precision: the weights the optimizer updates are always float32; ``bf16`` is mixed precision (the forward
and backward matmuls run in bfloat16 under autocast, as DeepSpeed/Accelerate's ``bf16`` does with float32
master weights). A bfloat16 weight near 0.02 cannot change by less than about 1e-4, so an Adam step of
5e-7 applied to bfloat16 weights rounds away: 8 steps changed under 1% of the weights, against nearly all
in float32. A model passed in already loaded in 16-bit is refused rather than trained that way. The model
is saved in float32 (what was trained; a 16-bit copy would round small updates away again).

The pairs' prompts are chat messages (DSPy's system and user messages) rendered with the model's own chat
template, the way vLLM renders them when ``ragsuite eval`` sends the same messages, so the model must have a
chat template (an instruct model, as the paper's Llama-3.1-8B-Instruct and Qwen2.5-7B-Instruct).

Needs the ``train`` extra (``pip install -e '.[train]'``): torch, transformers, trl, peft, datasets. Nothing
is imported at module level, so importing this module is free.

Example:
    >>> from ragsuite.align.trainer import train_dpo
    >>> result = train_dpo("runs/dnalign", model="meta-llama/Llama-3.1-8B-Instruct",
    ...                    out="models/llama-dpo", lora=True)  # doctest: +SKIP
    >>> result.losses[0], result.losses[-1]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ragsuite.align.pairs import TRAIN_FILE, read_trl
from ragsuite.errors import ConfigError, require

log = logging.getLogger("ragsuite.align.trainer")

#: The record of a training run, written beside the model.
TRAIN_RECORD = "align_train.json"
#: The default learning rate of full-parameter DPO (the paper's).
FULL_LEARNING_RATE = 5e-7
#: The default learning rate of a LoRA adapter (the alignment handbook's LoRA DPO recipe for a 7B model).
LORA_LEARNING_RATE = 5e-6
_FEATURE = "ragsuite align train"


@dataclass
class DPOSettings:
    """The training settings (paper defaults).

    Attributes:
        learning_rate: Default (None): 5e-7 (the paper) for all parameters, :data:`LORA_LEARNING_RATE` for
            LoRA; see :attr:`effective_learning_rate`.
        beta: DPO's KL weight, 0.1 (the paper).
        epochs: 1 (the paper).
        batch_size: Effective batch size, 8 (the paper).
        per_device_batch_size: Pairs per device per step; the rest is gradient accumulation.
        max_length: Longest prompt + completion in tokens (the official script: 8192); longer pairs are
            truncated by TRL.
        lora: Train a LoRA adapter (peft) instead of all parameters.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling.
        merge_lora: Save the adapter merged into the model (servable by vLLM as a plain model).
        bf16: Compute in bfloat16 under autocast over float32 weights (default: when a GPU supports it).
        gradient_checkpointing: Trade compute for memory (the official script turns it on).
        max_steps: Stop after this many optimizer steps (``-1``: the epochs decide).
        seed: Training seed.
        logging_steps: Log the loss every this many steps.
    """

    learning_rate: float | None = None
    beta: float = 0.1
    epochs: float = 1.0
    batch_size: int = 8
    per_device_batch_size: int = 1
    max_length: int = 8192
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    merge_lora: bool = True
    bf16: bool | None = None
    gradient_checkpointing: bool = False
    max_steps: int = -1
    seed: int = 0
    logging_steps: int = 1

    @property
    def effective_learning_rate(self) -> float:
        """The learning rate used: the one given, else the default of full training or of LoRA."""
        if self.learning_rate is not None:
            return self.learning_rate
        return LORA_LEARNING_RATE if self.lora else FULL_LEARNING_RATE

    def check(self) -> None:
        if self.effective_learning_rate <= 0 or self.beta <= 0 or self.epochs <= 0:
            raise ConfigError("learning rate, beta and epochs must be > 0")
        if self.per_device_batch_size < 1 or self.batch_size < self.per_device_batch_size:
            raise ConfigError("the batch size must be >= the per-device batch size, and both >= 1")
        if self.batch_size % self.per_device_batch_size:
            raise ConfigError(
                f"batch size {self.batch_size} is not a multiple of the per-device batch size "
                f"{self.per_device_batch_size}"
            )
        if self.max_length < 16:
            raise ConfigError("max_length must be at least 16 tokens")


@dataclass
class TrainResult:
    """What :func:`train_dpo` returns.

    Attributes:
        out_dir: Where the model and tokenizer were saved.
        losses: The training loss at each logged step, in order.
        steps: Optimizer steps taken.
        pairs: Preference pairs trained on.
        settings: The settings used.
    """

    out_dir: Path
    losses: list[float]
    steps: int
    pairs: int
    settings: dict[str, Any] = field(default_factory=dict)


def require_train_extra(*, lora: bool = False) -> None:
    """Import what training needs, or raise naming ``pip install -e '.[train]'``."""
    for module in ("torch", "transformers", "datasets", "trl", *(("peft",) if lora else ())):
        require(module, extra="train", feature=_FEATURE)


def _weights_dtype(model: Any) -> str:
    """The dtype of the trained (trainable) weights, e.g. ``float32``."""
    dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}
    return ",".join(sorted(dtypes)) or "none"


def _refuse_half_precision(model: Any, *, name: str, lr: float) -> None:
    """Raise when a loaded model's floating-point weights are 16-bit: the optimizer would update them in
    16 bits, where updates of ``lr`` round away."""
    import torch

    half = sorted(
        {
            str(p.dtype).removeprefix("torch.")
            for p in model.parameters()
            if p.dtype in (torch.bfloat16, torch.float16)
        }
    )
    if half:
        raise ConfigError(
            f"{name} has {'/'.join(half)} weights: trained in {half[0]}, updates at learning rate {lr:g} "
            "round away. Load it in float32 (from_pretrained(..., dtype=torch.float32)) or pass its name or "
            "path; --bf16 then runs the compute in bfloat16 over float32 weights"
        )


def _train_file(data: str | os.PathLike[str]) -> Path:
    path = Path(data).expanduser()
    return path / TRAIN_FILE if path.is_dir() else path


def train_dpo(
    data: str | os.PathLike[str],
    *,
    model: str | os.PathLike[str] | Any,
    out: str | os.PathLike[str],
    settings: DPOSettings | None = None,
    tokenizer: Any = None,
    stages: list[str] | None = None,
) -> TrainResult:
    """DPO-train ``model`` on the pairs of an ``align build`` directory (or a TRL preference JSONL file).

    Args:
        data: The build directory (its ``train.jsonl``) or a preference file.
        model: A model name or path ``AutoModelForCausalLM`` loads, or a loaded model.
        out: Where to save the trained model and tokenizer.
        settings: Training settings (default: the paper's).
        tokenizer: The tokenizer (default: the model's).
        stages: Train only on the pairs of these stages (default: all).

    Returns:
        :class:`TrainResult`.

    Raises:
        MissingExtraError: without the ``train`` extra (the message names the pip command).
        ConfigError: no pairs, a model without a chat template, bad settings.
    """
    settings = settings or DPOSettings()
    settings.check()
    settings = replace(settings, learning_rate=settings.effective_learning_rate)
    require_train_extra(lora=settings.lora)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    path = _train_file(data)
    rows = read_trl(path)
    if stages:
        unknown = set(stages) - {str(r.get("stage")) for r in rows}
        if unknown:
            raise ConfigError(f"{path} has no pairs of stage(s) {', '.join(sorted(unknown))}")
        rows = [r for r in rows if r.get("stage") in stages]
    dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])

    name = str(model) if isinstance(model, (str, os.PathLike)) else getattr(model, "name_or_path", "model")
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"the tokenizer of {name} has no chat template, so the pairs' chat prompts cannot be rendered as "
            "the server will render them; train a chat/instruct model (the paper: Llama-3.1-8B-Instruct, "
            "Qwen2.5-7B-Instruct)"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    cuda = torch.cuda.is_available()
    bf16 = settings.bf16 if settings.bf16 is not None else bool(cuda and torch.cuda.is_bf16_supported())
    if isinstance(model, (str, os.PathLike)):
        # float32 master weights whatever the checkpoint's dtype (a bfloat16 checkpoint loads exactly);
        # bf16 is the Trainer's autocast.
        model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    else:
        _refuse_half_precision(model, name=name, lr=settings.effective_learning_rate)
    peft_config = None
    if settings.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=settings.lora_r,
            lora_alpha=settings.lora_alpha,
            lora_dropout=0.05,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = max(settings.batch_size // (settings.per_device_batch_size * world), 1)
    out_dir = Path(out).expanduser()
    config = DPOConfig(
        output_dir=str(out_dir),
        learning_rate=settings.effective_learning_rate,
        beta=settings.beta,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.per_device_batch_size,
        gradient_accumulation_steps=accumulation,
        max_length=settings.max_length,
        bf16=bf16,
        gradient_checkpointing=settings.gradient_checkpointing,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to=[],
        seed=settings.seed,
        use_cpu=not cuda,
        dataloader_num_workers=0,
    )
    trainer = DPOTrainer(
        model=model,
        ref_model=None,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    weights_dtype = _weights_dtype(trainer.model)  # before a LoRA merge leaves nothing trainable
    losses = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    out_dir.mkdir(parents=True, exist_ok=True)
    main_process = trainer.is_world_process_zero()
    if settings.lora and settings.merge_lora:
        merged = trainer.model.merge_and_unload()
        if main_process:
            merged.save_pretrained(str(out_dir))
    else:
        # The Trainer gathers sharded weights (DeepSpeed ZeRO-3, FSDP) and writes from the main process only.
        trainer.save_model(str(out_dir))
    if main_process:
        tokenizer.save_pretrained(str(out_dir))
    result = TrainResult(
        out_dir=out_dir,
        losses=losses,
        steps=int(trainer.state.global_step),
        pairs=len(rows),
        settings=asdict(settings),
    )
    record = {
        "data": str(path.resolve()),
        "base_model": name,
        "pairs": len(rows),
        "stages": sorted({str(r.get("stage")) for r in rows}),
        "steps": result.steps,
        "losses": losses,
        "settings": result.settings,
        "gradient_accumulation_steps": accumulation,
        "world_size": world,
        "bf16": bf16,
        "weights_dtype": weights_dtype,
    }
    if main_process:
        (out_dir / TRAIN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return result


__all__ = [
    "FULL_LEARNING_RATE",
    "LORA_LEARNING_RATE",
    "TRAIN_RECORD",
    "DPOSettings",
    "TrainResult",
    "require_train_extra",
    "train_dpo",
]
