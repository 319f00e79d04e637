"""mmrun's own engine: the entry's model on the portable API, data parallelism, on PyTorch and MindSpore.

The model is whatever `model_provider(pre_process=True, post_process=True)` returns (mmrun's GPT for
models/pretrain_gpt.py), moved to this process's device and cast for --fp16/--bf16 (Megatron's
Float16Module: fp32 main params live in the optimizer). The step is the portable `TrainStep` (backward,
gradient all-reduce over every rank, clipping, AdamW with Megatron's no-decay rule, mmrun's loss scaler),
fed by engines/forward_plan.py: `forward_step` runs outside autograd and its model call and loss are
replayed inside the step (compiled with mindspore.jit on MindSpore unless --no-ms-jit).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Mapping, Sequence

from mmrun.engines.base import ParallelLayout, ShardState, StepResult, TrainingError
from mmrun.precision.timers import NO_TIMERS
from mmrun.engines.forward_plan import ForwardPlan, scalar_loss
from mmrun.models import recompute


# MindSpore's compiled step on a CPU keeps ~155 MiB a GPT layer outside its memory pool (its graph's kernels), and
# a recomputed layer adds to it; its PyNative step (eager update on a CPU) saves more (measured:
# docs/memory-and-speed.md, benchmarks/recompute_memory.py). Recomputation there runs PyNative unless --ms-jit.
RECOMPUTE_PYNATIVE_NOTICE = ("notice: MindSpore on a CPU: the train step runs PyNative (as --no-ms-jit) because "
                             "activation recomputation saves memory only there (the compiled CPU step keeps every "
                             "kernel's buffers: docs/memory-and-speed.md); --ms-jit compiles it anyway")


def ms_step_jit(args: Any, framework: str, device_kind: str, recomputed: bool) -> tuple[bool, str | None]:
    """(compile the MindSpore step?, notice or None): compiled unless --no-ms-jit, or on a CPU with recomputation
    applied and no --ms-jit."""
    jit = framework == "mindspore" and not getattr(args, "no_ms_jit", False)
    if jit and recomputed and device_kind == "cpu" and not getattr(args, "ms_jit", False):
        return False, RECOMPUTE_PYNATIVE_NOTICE
    return jit, None


def report_pairs(result: Any) -> dict[str, tuple[float, float]]:
    """loss_func's report dict -> {key: (numerator, denominator)} as floats: Megatron's (sum, count)
    tuples or 2-element tensors, or a plain value (count 1)."""
    from mmrun.backend import tensors

    has_report = isinstance(result, tuple) and isinstance(result[-1], dict)
    report = result[-1] if has_report else {"lm loss": scalar_loss(result)}
    pairs = {}
    for key, value in report.items():
        if isinstance(value, (tuple, list)) and len(value) == 2:
            pairs[key] = (float(tensors.to_numpy(value[0])), float(tensors.to_numpy(value[1])))
            continue
        array = tensors.to_numpy(value).reshape(-1)
        pairs[key] = (float(array[0]), float(array[1])) if array.size == 2 else (float(array[0]), 1.0)
    return pairs


def _count_parameters(model: Any) -> int:
    return int(sum(math.prod(int(d) for d in p.shape) for p in model.parameters()))


class PortableEngine:
    """Data parallelism over every rank with mmrun's portable TrainStep (both frameworks)."""

    name = "mmrun"
    model_names = "mmrun-gpt"

    def __init__(self, args: Any, framework: str, log: Callable[[str], None]) -> None:
        self.args, self.framework, self.log = args, framework, log
        self.layout = ParallelLayout()
        self.model: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.grad_scaler: Any = None
        self._plan: ForwardPlan | None = None
        self._recomputed: list[str] = []  # the lines recompute.apply returned (build)
        self._step: Any = None
        self.timers: Any = NO_TIMERS  # --timing-log-level (mmrun.precision.monitor sets it)

    # ----------------------------------------------------------------------------------- set-up
    def initialize(self, args: Any) -> ParallelLayout:
        from mmrun import backend

        dist = backend.distributed
        world, rank = dist.get_world_size(), dist.get_rank()
        self.layout = ParallelLayout(world_size=world, dp=world, dp_rank=rank)
        return self.layout

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        from mmrun import backend
        from mmrun.backend.grad_scaler import grad_scaler_for

        args = self.args
        self.scheduler = scheduler
        # On the device before anything else refers to the parameters (the optimizer keeps them).
        self.model = backend.device.to_device(model_provider(pre_process=True, post_process=True))
        # --recompute-* and model.json's per-module recompute keys (an entry's model_provider sets the sections)
        self._recomputed = recompute.apply(self.model, recompute.plans(args, getattr(args, "recompute_sections", None)))
        for line in self._recomputed:
            self.log(f"> activation recomputation: {line}")
        precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        if precision != "fp32":
            # Megatron's Float16Module: the model computes in half precision; the optimizer (built next,
            # from the cast parameters) keeps the fp32 main params.
            self.model.to(backend.tensors.dtype(precision))
        self.grad_scaler = grad_scaler_for(precision, args.loss_scale, args.initial_loss_scale, args.min_loss_scale,
                                           args.loss_scale_window, args.hysteresis)
        if precision != "fp32":
            scaling = ("no loss scaling" if self.grad_scaler is None else
                       f"dynamic loss scale from {self.grad_scaler.scale:g}" if hasattr(self.grad_scaler, "hysteresis")
                       else f"constant loss scale {self.grad_scaler.scale:g}")
            self.log(f"> {precision} model with fp32 main params in the optimizer, {scaling}")
        optim = backend.optim
        hyper = dict(lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                     weight_decay=args.weight_decay, no_decay=optim.megatron_no_decay)
        if self._sharded():
            from mmrun.backend.mindspore.parallel import zero  # the distributed optimizer (ZeRO-1) on MindSpore

            dist = backend.distributed
            local = getattr(self.model, "local_gradients", None)  # expert parallelism: experts over their EDP group
            self.optimizer = zero.ShardedAdamW(self.model.named_parameters(), dp=dist.get_world_size(),
                                               rank=dist.get_rank(), **hyper) if local is None else \
                zero.ExpertShardedAdamW(self.model.named_parameters(), local.names, zero.world_group(), local.group,
                                        **hyper)
            self.log(f"> distributed optimizer: AdamW state sharded over {dist.get_world_size()} data-parallel "
                     f"ranks, {zero.state_bytes(self.optimizer)} bytes of optimizer state on this rank "
                     + ("(gradients reduce-scattered, parameters all-gathered, in the step)" if local is None else
                        f"(the experts' over their {local.group.size} expert-data-parallel rank(s): "
                        f"{zero.state_bytes(self.optimizer.experts)} bytes of it)"))
        else:
            self.optimizer = optim.AdamW(self.model.named_parameters(), **hyper)

    def _sharded(self) -> bool:
        """--use-distributed-optimizer on MindSpore: backend/mindspore/parallel/zero.py (on PyTorch megatron-core runs it)."""
        return self.framework == "mindspore" and bool(getattr(self.args, "use_distributed_optimizer", False))

    def parameter_count(self) -> int:
        return _count_parameters(self.model)

    def device(self) -> str:
        from mmrun import backend

        first = next(iter(self.model.parameters()), None)
        device = getattr(first, "device", None)
        return str(device) if device is not None and not callable(device) else str(backend.device.default_device())

    # ----------------------------------------------------------------------------------- steps
    def train_step(self, forward_step_func: Callable, data_iterators: Sequence[Iterator]) -> StepResult:
        from mmrun import backend

        args = self.args
        if self._plan is None:
            # MindSpore: compiled by default (same losses as PyNative, several times faster); --ms-jit insists.
            jit, notice = ms_step_jit(args, self.framework, backend.device.detect().kind, bool(self._recomputed))
            if notice:
                self.log(notice)
            self._plan = ForwardPlan(forward_step_func, self.model, jit=jit,
                                     jit_required=bool(getattr(args, "ms_jit", False)), notice=self.log)
            self.model.train()
        with self.timers.phase("batch-generator"):
            micro_batches = [self._plan.capture(data_iterators[0]) for _ in range(args.num_micro_batches)]
        if self._step is None and self._plan.jit and getattr(args, "ms_compile_cache", None):
            from mmrun.engines import compile_cache

            compile_cache.open_for_job(args, micro_batches, self.log)
        if self._step is None:  # after the first capture: the plan then knows whether the loss compiles
            step_class = backend.train_step.TrainStep
            if self._sharded():
                from mmrun.backend.mindspore.parallel import zero

                step_class = zero.ExpertShardedTrainStep if hasattr(self.optimizer, "experts") \
                    else zero.ShardedTrainStep
            self._step = step_class(
                self.model, self.optimizer, loss_fn=self._plan.loss, lr_scheduler=self.scheduler,
                clip_grad=args.clip_grad, increment=args.global_batch_size,
                jit=self._plan.jit if self.framework == "mindspore" else None, grad_scaler=self.grad_scaler,
                local_grads=getattr(self.model, "local_gradients", None))  # expert parallelism's experts
            self._step.timers = self.timers
            if self.framework == "mindspore":
                self._step.announce = self.log
            if self.framework == "mindspore":
                self.log(f"> MindSpore train step: {'mindspore.jit (graph)' if self._plan.jit else 'PyNative'}")
        return self._step(micro_batches)

    def evaluate(self, forward_step_func: Callable, data_iterators: Sequence[Iterator],
                 eval_iters: int) -> dict[str, float]:
        """Megatron's evaluate: sums of (loss, tokens) over eval_iters x micro-batches and all ranks, divided."""
        import numpy as np

        from mmrun import backend
        from mmrun.backend import autograd, tensors

        self.model.eval()
        totals: dict[str, list[float]] = {}
        try:
            with autograd.no_grad():
                for _ in range(eval_iters):
                    for _ in range(self.args.num_micro_batches):
                        output, loss_callable = forward_step_func(data_iterators[0], self.model)
                        for key, (num, den) in report_pairs(loss_callable(output)).items():
                            acc = totals.setdefault(key, [0.0, 0.0])
                            acc[0] += num
                            acc[1] += den
        finally:
            self.model.train()
        keys = sorted(totals)
        flat = np.array([v for k in keys for v in totals[k]], dtype=np.float32)
        reduced = tensors.to_numpy(backend.distributed.all_reduce(tensors.from_numpy(flat), op="sum"))
        return {k: float(reduced[2 * i] / reduced[2 * i + 1]) for i, k in enumerate(keys)}

    # ------------------------------------------------------------------------------ checkpoints
    def _expert_shards(self) -> Any:
        """Expert parallelism's checkpoint joiner (train_step_shared.LocalGradients.shards), else None."""
        local = getattr(self.model, "local_gradients", None)
        return None if local is None else local.shards

    def checkpoint_state(self) -> ShardState | None:
        from mmrun import backend
        from mmrun.backend import tensors

        # the distributed optimizer gathers its shards into whole tensors: every rank takes part
        sharded_state = self.optimizer.state_dict() if getattr(self.optimizer, "sharded", False) else None
        shards = self._expert_shards()
        if backend.distributed.get_rank() != 0 and shards is None:
            return None  # every rank holds the same replica: rank 0 writes it
        state = sharded_state or self.optimizer.state_dict()
        model, moments = tensors.state_dict_to_numpy(self.model.state_dict()), tensors.state_dict_to_numpy(state["tensors"])
        if shards is not None:  # expert parallelism: every rank's experts joined (a collective), rank 0 writes
            model, moments = shards.gather(model), shards.gather(moments)
            if backend.distributed.get_rank() != 0:
                return None
        optimizer = {**{k: v for k, v in state.items() if k != "tensors"}, "tensors": moments}
        return ShardState(model=model, optimizer=optimizer,
                          meta={"grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict()})

    def expected_shapes(self) -> tuple[dict, dict, dict]:
        from mmrun.backend.optimizer_params import MAIN_PARAM_KEY, STATE_KEYS

        shards = self._expert_shards()
        whole = (lambda name, shape: shape) if shards is None else shards.whole_shape
        model = {name: whole(name, tuple(int(d) for d in value.shape)) for name, value in self.model.state_dict().items()}
        params = {name: whole(name, tuple(int(d) for d in p.shape))
                  for name, p in zip(self.optimizer.names, self.optimizer.params)}
        optimizer = {f"{n}.{k}": s for n, s in params.items() for k in STATE_KEYS}
        return model, optimizer, {f"{n}.{MAIN_PARAM_KEY}": s for n, s in params.items()}

    def load_checkpoint_state(self, state: ShardState, load_optimizer: bool) -> None:
        from mmrun.backend import tensors

        shards = self._expert_shards()
        model = state.model if shards is None else shards.take(state.model)  # this rank's experts
        self.model.load_state_dict(tensors.state_dict_from_numpy(model))
        self.optimizer.reload_model_params()  # fp32 main params follow the loaded weights (a saved main param wins next)
        if load_optimizer and state.optimizer is not None:
            optimizer = state.optimizer
            if shards is not None:
                optimizer = {**optimizer, "tensors": shards.take(optimizer["tensors"])}
            self.optimizer.load_state_dict(optimizer)
            if self.grad_scaler is not None and state.meta.get("grad_scaler"):
                self.grad_scaler.load_state_dict(state.meta["grad_scaler"])

    def rng_state(self) -> dict[str, Any] | None:
        return None

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """mmrun's engine has no RNG beyond the backend's seeding (saved by the checkpoint itself)."""


def check_forward_step_result(returned: Any) -> None:
    if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
        raise TrainingError(f"forward_step must return (output_tensor, loss_func) as Megatron's does. "
                            f"Received: {type(returned).__name__}")
