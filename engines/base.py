"""The engine seam: what the training loop asks of an engine, and what an engine tells the loop.

The loop (training/pretrain.py) owns what mmrun owns: the arguments and the feature gate, the data
loaders, the learning-rate schedule, Megatron's log lines, checkpoint files (safetensors + JSON, atomic,
verified) and resume. An engine owns the rest: parallel state, building and wrapping the model (its
precision), the forward/backward schedule over micro-batches and the optimizer (with its loss scaler).

The loop calls, in this order (every rank calls every method; collectives inside are the engine's):

    layout = engine.initialize(args)                   after the process group exists; seeds the engine's RNGs
    engine.build(model_provider, scheduler)            model chunk(s) from the entry's model_provider, optimizer
    out = engine.train_step(forward_step, iterators)   one optimizer step over args.num_micro_batches -> StepResult
    losses = engine.evaluate(forward_step, iterators, eval_iters)   {"lm loss": mean, ...} on every rank
    shard = engine.checkpoint_state()                  this rank's ShardState, or None if it writes no files
    engine.load_checkpoint_state(shard)                every rank, after the loop verified the files

`iterators` holds one data iterator per model chunk (`layout.model_chunks`, >1 only for virtual pipeline
stages); each iterates this data-parallel rank's samples (`layout.dp_rank` of `layout.dp`), all chunks the
same samples. `forward_step(data_iterator, model)` is the entry's Megatron callback, returning
`(output_tensor, partial(loss_func, ...))`; an engine calls it where its schedule needs it (the
portable engine records and replays it, megatron-core's schedules call it per micro-batch and stage).

Checkpoint state is numpy, named after the engine's parameters for this rank (`ShardState.model`), with
the optimizer state named after them (`<param>.exp_avg`, `<param>.exp_avg_sq`, `<param>.main_param`),
so the files need no framework to read and convert (models/gpt_names.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from mmrun.backend.train_step_shared import StepResult  # noqa: F401 - the step's result type, one definition

# How a checkpoint's tensors are named: mmrun's GPT names, megatron-core's GPTModel names for one rank, or
# MindSpeed-MM's names of the vision-language model for one (TP, PP) rank (models/vlm/mm_layout.py).
MODEL_NAMES = ("mmrun-gpt", "megatron-core", "mindspeed-mm")


class TrainingError(RuntimeError):
    """The callbacks or the data do not fit the loop (one line, says what to change); exit 1."""


class ArgumentsError(ValueError):
    """A usage error in the training arguments: one line, says what was received and what to do.
    Defined here, below both, because engines refuse arguments too; mmrun.training.arguments re-exports it."""

    exit_code = 2


class ModelConfigError(ValueError):
    """model.json (or the YAML's model section) cannot build a model: one line, what to do."""

    exit_code = 2


def rank_dir_name(tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1, expert_rank: int | None = None) -> str:
    """Megatron's directory for one model-parallel rank: `mp_rank_00`, `mp_rank_01_003`, `mp_rank_00_001_002`
    (a shard's name; mmrun.training.checkpoint_layout re-exports it with the rest of the checkpoint layout)."""
    name = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name if expert_rank is None else f"{name}_{expert_rank:03d}"


@dataclass(frozen=True)
class ParallelLayout:
    """Where this process sits in the job's parallel grid (Megatron's rank order: tp fastest, then cp, dp, pp)."""

    world_size: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    cp: int = 1
    dp: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    cp_rank: int = 0
    dp_rank: int = 0

    @property
    def model_chunks(self) -> int:
        return self.vpp

    @property
    def rank_dir(self) -> str:
        """This rank's checkpoint directory name (`mp_rank_00`, `mp_rank_01_001`)."""
        return rank_dir_name(self.tp_rank, self.pp_rank, self.pp)

    @property
    def writes_checkpoint(self) -> bool:
        """One rank per (tensor, pipeline) shard writes its files: the first of its data/context group."""
        return self.dp_rank == 0 and self.cp_rank == 0

    def describe(self) -> str:
        parts = [f"data-parallel {self.dp}"]
        for label, size in (("tensor-parallel", self.tp), ("pipeline-parallel", self.pp),
                            ("virtual stages", self.vpp), ("context-parallel", self.cp)):
            if size > 1:
                parts.append(f"{label} {size}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp, "dp": self.dp}


@dataclass
class ShardState:
    """One rank's share of a checkpoint, as numpy: what `checkpointing` writes into its rank directory."""

    model: dict[str, np.ndarray]
    optimizer: dict[str, Any] | None  # {"step": int, "lr": float, "tensors": {name: array}}
    meta: dict[str, Any] = field(default_factory=dict)  # JSON: model_names, loss scaler, ...


@runtime_checkable
class Engine(Protocol):
    """What the training loop drives. Implementations: engines/portable.py (mmrun's own, both
    frameworks, data parallelism), engines/torch/megatron_core/engine.py (megatron-core, PyTorch) and
    engines/mindspore/parallel/engine.py (tensor/pipeline parallelism, MindSpore)."""

    name: str  # shown in the log: "mmrun", "megatron-core"
    model_names: str  # one of MODEL_NAMES: how checkpoint tensors are named

    def initialize(self, args: Any) -> ParallelLayout:
        """Parallel state on top of the started process group; seeds this engine's RNGs from args.seed."""

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        """Call the entry's model_provider (per model chunk), place and wrap the model, build the optimizer
        (and loss scaler from the precision arguments); the engine applies `scheduler.get_lr()` each step
        and advances it by `args.global_batch_size` after every step that updated."""

    def train_step(self, forward_step_func: Callable, data_iterators: Sequence[Iterator]) -> StepResult:
        """One optimizer step over args.num_micro_batches micro-batches; the result is the same on every rank
        (loss: mean over micro-batches and data-parallel ranks). StopIteration when the data runs out."""

    def evaluate(self, forward_step_func: Callable, data_iterators: Sequence[Iterator],
                 eval_iters: int) -> dict[str, float]:
        """Forward only over eval_iters x num_micro_batches micro-batches; report key -> sum / count over
        all of them and all data-parallel ranks, on every rank. StopIteration when the data runs out."""

    def parameter_count(self) -> int:
        """Parameters held by this rank."""

    def device(self) -> str:
        """Where this rank's parameters live, as the framework names it."""

    def checkpoint_state(self) -> ShardState | None:
        """This rank's share of a checkpoint, or None when it writes none (call on every rank)."""

    def expected_shapes(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """(model tensors, optimizer tensors, optional optimizer tensors) a loadable shard must have."""

    def load_checkpoint_state(self, state: ShardState, load_optimizer: bool) -> None:
        """Apply a verified shard (model weights; optimizer state and loss scaler when load_optimizer)."""

    def rng_state(self) -> dict[str, Any] | None:
        """JSON state of the engine's own RNGs (beyond the backend's seeding), None if it has none."""

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore `rng_state()`'s result."""
