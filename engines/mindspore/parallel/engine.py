"""The MindSpore tensor/pipeline/sequence-parallel engine behind the trainer's engine seam (engines/base.py).

What mmrun's training loop (training/pretrain.py) gets from this package, in the shape of the PyTorch
megatron-core engine (engines/torch/megatron_core/engine.py):

- parallel state: `groups.initialize_model_parallel(tp, pp, sequence_parallel)` (megatron-core's rank order,
  MindSpore communication groups);
- the model: megatron-core's GPTModel architecture on MindSpore (engines/mindspore/parallel/gpt.py), this rank's pipeline
  stage and tensor-parallel shard, named as megatron-core's `state_dict()` names it on this rank, starting from
  the weights the PyTorch engine starts from (models/gpt_names.py `initial_shard`: mmrun's GPT init for --seed,
  this rank's shard), so one seed gives one network on both frameworks and every TP/PP split;
- the step: `ParallelTrainStep` (Megatron's 1F1B over isend/irecv, finalize_model_grads, the gradient norm over
  the model-parallel group, clipping, AdamW with Megatron's no-decay rule), the learning rate from mmrun's
  schedule each step, the schedule advanced by --global-batch-size after each update.

The engine trains this GPT whatever the entry's model_provider builds (like `--use-mcore-models` on PyTorch it
is megatron-core's GPTModel), and reads the micro-batches from the data iterator itself (the loader's
tokens, position_ids, labels, loss_mask; every stage reads them, as the schedule sizes its messages from them).
Losses: the train loss and `evaluate`'s "lm loss" are the mean over micro-batches of each micro-batch's
sum(loss * mask) / sum(mask) (ParallelTrainStep's reduction), which equals Megatron's token-weighted
sum / count when every micro-batch has as many loss tokens (always, unless --eod-mask-loss masks some).

Not done here (one-line refusal in `initialize`): --fp16/--bf16, virtual pipeline stages, context parallelism,
Transformer Engine layers. --use-distributed-optimizer shards AdamW's state over the data-parallel group
(backend/mindspore/parallel/zero.py's ShardedParallelTrainStep).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.train_step_shared import StepResult
from mmrun.engines.base import ParallelLayout, ShardState

# (what the run asked for, why this engine cannot) -> the refusal; checked in this order.
_REFUSED: tuple[tuple[Callable[[Any], str | None], str], ...] = (
    (lambda a: "--fp16" if a.fp16 else "--bf16" if a.bf16 else None,
     "it trains in fp32 only (no loss scaler or half-precision pipeline buffers); drop it, or run on PyTorch "
     "(megatron-core)"),
    (lambda a: (f"--virtual-pipeline-model-parallel-size {a.virtual_pipeline_model_parallel_size}"
                if (a.virtual_pipeline_model_parallel_size or 1) > 1 else None),
     "it runs Megatron's 1F1B without interleaving; drop it, or run on PyTorch (megatron-core)"),
    (lambda a: (f"--context-parallel-size {a.context_parallel_size}" if (a.context_parallel_size or 1) > 1 else None),
     "it has no context parallelism; drop it, or run on PyTorch (megatron-core)"),
    (lambda a: ("--transformer-impl transformer_engine" if getattr(a, "transformer_impl", "local") == "transformer_engine"
                else None),
     "Transformer Engine is a PyTorch/CUDA library; use --transformer-impl local"),
)


def refusal(args: Any) -> str | None:
    """The one-line reason this engine cannot run these arguments, or None."""
    for given, why in _REFUSED:
        flag = given(args)
        if flag:
            return (f"the MindSpore tensor/pipeline-parallel engine cannot run {flag}: {why}. Received: {flag} "
                    "with --ai-framework mindspore")
    return None


class MindSporeParallelEngine:
    """engines/base.py's Engine on MindSpore's tensor/pipeline/sequence parallelism (module docstring)."""

    name = "mindspore-parallel"
    model_names = "megatron-core"

    def __init__(self, args: Any, framework: str, log: Callable[[str], None]) -> None:
        self.args, self.log = args, log
        self.layout = ParallelLayout()
        self.state: Any = None
        self.step: Any = None
        self.scheduler: Any = None
        self._cache_opened = False  # --ms-compile-cache: set up once, at the first step

    # ----------------------------------------------------------------------------------- set-up
    def initialize(self, args: Any) -> ParallelLayout:
        from mmrun.backend.mindspore.parallel import groups

        reason = refusal(args)
        if reason:
            raise UsageError(reason)
        self.state = state = groups.initialize_model_parallel(
            args.tensor_model_parallel_size, args.pipeline_model_parallel_size, bool(args.sequence_parallel))
        self.layout = ParallelLayout(
            world_size=state.world_size, tp=state.tensor_model_parallel_size, pp=state.pipeline_model_parallel_size,
            dp=state.data_parallel_size, tp_rank=state.tp_rank, pp_rank=state.pp_rank, dp_rank=state.dp_rank)
        self.log(f"> MindSpore tensor/pipeline-parallel engine (Megatron's design on MindSpore collectives): "
                 f"{self.layout.describe()}" + (", sequence-parallel" if state.sequence_parallel else "")
                 + (f", distributed optimizer (AdamW state sharded over {state.data_parallel_size} data-parallel "
                    "ranks)" if args.use_distributed_optimizer else ""))
        return self.layout

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        from mmrun.engines.mindspore.parallel.gpt import build_engine

        args = self.args
        self.log("building GPT model (megatron-core's GPTModel on MindSpore: engines/mindspore/parallel/gpt.py; the entry's "
                 "model_provider is not called) ...")
        # Its initial weights are the PyTorch megatron-core engine's for this rank (gpt_names.initial_shard).
        self.step = build_engine(args, jit=not args.no_ms_jit)
        self.scheduler = scheduler
        self.step.lr_scheduler, self.step.increment = scheduler, args.global_batch_size
        self.step.announce = self.log
        self.log(f"> MindSpore parallel train step: {'mindspore.jit (graph)' if self.step.jit else 'PyNative'}")

    def parameter_count(self) -> int:
        return int(sum(int(np.prod(p.shape)) for p in self.step.optimizer.params))

    def device(self) -> str:
        from mmrun import backend

        return str(backend.device.default_device())

    # ----------------------------------------------------------------------------------- steps
    def _micro_batches(self, data_iterator: Iterator) -> list[tuple[np.ndarray, ...]]:
        """args.num_micro_batches (tokens, position_ids, labels, loss_mask) from the loader (StopIteration passes)."""
        batches = []
        for _ in range(self.args.num_micro_batches):
            data = next(data_iterator)
            batches.append((data["tokens"], data["position_ids"], data["labels"], data["loss_mask"]))
        return batches

    def train_step(self, forward_step_func: Callable, data_iterators: Sequence[Iterator]) -> StepResult:
        micro_batches = self._micro_batches(data_iterators[0])
        if not self._cache_opened and self.step.jit and getattr(self.args, "ms_compile_cache", None):
            from mmrun.engines import compile_cache

            compile_cache.open_for_job(self.args, micro_batches, self.log)  # before the first compile
        self._cache_opened = True
        return self.step(micro_batches)

    def evaluate(self, forward_step_func: Callable, data_iterators: Sequence[Iterator],
                 eval_iters: int) -> dict[str, float]:
        losses = [self.step.evaluate(self._micro_batches(data_iterators[0])) for _ in range(eval_iters)]
        return {"lm loss": float(np.mean(losses))} if losses else {}

    # ------------------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> ShardState | None:
        from mmrun.backend import tensors

        # the distributed optimizer gathers its shards over the data-parallel group: every rank takes part
        sharded = self.step.optimizer.state_dict() if getattr(self.step.optimizer, "sharded", False) else None
        if not self.layout.writes_checkpoint:
            return None
        state = sharded or self.step.optimizer.state_dict()
        optimizer = {"step": int(state["step"]), "lr": float(state["lr"]),
                     "tensors": tensors.state_dict_to_numpy(state["tensors"])}
        return ShardState(model=self.step.model.rank_state_dict(), optimizer=optimizer, meta={"grad_scaler": None})

    def expected_shapes(self) -> tuple[dict, dict, dict]:
        from mmrun.backend.optimizer_params import MAIN_PARAM_KEY, STATE_KEYS

        optimizer = self.step.optimizer
        params = {n: tuple(int(d) for d in p.shape) for n, p in zip(optimizer.names, optimizer.params)}
        model = {n: tuple(int(d) for d in p.shape) for n, p in self.step.model.named_parameters()}
        return (model, {f"{n}.{k}": s for n, s in params.items() for k in STATE_KEYS},
                {f"{n}.{MAIN_PARAM_KEY}": s for n, s in params.items()})

    def load_checkpoint_state(self, state: ShardState, load_optimizer: bool) -> None:
        self.step.model.load_rank_state_dict(state.model)
        if load_optimizer and state.optimizer is not None:
            self.step.optimizer.load_state_dict(state.optimizer)

    def rng_state(self) -> dict[str, Any] | None:
        """None: the only generator this engine draws from is the backend's dropout generator, which the
        checkpoint saves with the backend's seeding state (backend/mindspore/seeding.py)."""
        return None

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore (see rng_state)."""
