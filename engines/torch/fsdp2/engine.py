"""The torch-native engine: the entry's torch model sharded by FSDP2 (`--use-torch-fsdp2
--fsdp2-config-path F`), or replicated by torch's DDP (models trained as they are, without FSDP2).

What mmrun's loop gets from it (engines/base.py's seam):

- initialize: a process group always (DeviceMesh needs one, also for one process), the layout: every
  rank is a data-parallel rank (FSDP2 shards parameters, not the batch);
- build: model_provider()'s torch module on this device; FSDP2: the file's patterns resolved against
  the model's own module paths (errors name the pattern and what exists, before any step), then
  engines/torch/fsdp2/sharding.py; the optimizer is torch's AdamW over the (sharded) parameters with
  Megatron's no-decay rule, the reference single-tensor kernel on the CPU like mmrun's own engine, so
  the losses equal one unsharded process;
- train_step: the entry's forward_step per micro-batch, called directly (no replay: the model is torch),
  backward of loss_sum / num_tokens / micro-batches (Megatron's per-micro-batch mean), gradients averaged
  over ranks by FSDP2's reduce-scatter or DDP's all-reduce (only on the last micro-batch), clipping by the
  global norm (DTensor-aware), the learning rate from mmrun's schedule;
- checkpoints: --ckpt-format safetensors gathers the whole model and optimizer state to rank 0 in
  mmrun's names (resumable by any engine and framework for mmrun's GPT); --ckpt-format torch_dcp saves
  and loads shards with torch.distributed.checkpoint (dcp.py), resumable at another world size and
  sharding_size.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from mmrun.backend.errors import UsageError
from mmrun.backend.train_step_shared import StepResult
from mmrun.engines.base import ParallelLayout, ShardState, TrainingError


def _report_pairs(result: Any) -> dict[str, tuple[float, float]]:
    """loss_func's report -> {key: (sum, count)}: Megatron's (sum, count) tuples or 2-element tensors,
    or a plain value (count 1)."""
    has_report = isinstance(result, tuple) and isinstance(result[-1], dict)
    report = result[-1] if has_report else {"lm loss": result[0] if isinstance(result, tuple) else result}
    pairs = {}
    for key, value in report.items():
        if isinstance(value, (tuple, list)) and len(value) == 2:
            pairs[key] = (float(torch.as_tensor(value[0]).detach().float().sum()),
                          float(torch.as_tensor(value[1]).detach().float().sum()))
            continue
        flat = torch.as_tensor(value).detach().double().reshape(-1)
        pairs[key] = (float(flat[0]), float(flat[1])) if flat.numel() == 2 else (float(flat[0]), 1.0)
    return pairs


def _objective(result: Any) -> torch.Tensor:
    """The tensor to differentiate for one micro-batch: loss_sum / num_tokens (Megatron core 0.12's
    3-tuple), or the loss itself ((loss, report) or a bare loss)."""
    if isinstance(result, tuple) and len(result) == 3:
        loss, num_tokens, _ = result
        return loss / torch.clamp(torch.as_tensor(num_tokens, device=loss.device, dtype=loss.dtype), min=1)
    return result[0] if isinstance(result, tuple) else result


def _check_forward_step(returned: Any) -> tuple[Any, Callable]:
    if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
        raise TrainingError("forward_step must return (output_tensor, loss_func) as Megatron's does. "
                            f"Received: {type(returned).__name__}")
    return returned


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class TorchNativeEngine:
    """engines/base.py's Engine for torch modules: FSDP2 (`fsdp2=True`) or DDP."""

    model_names = "mmrun-gpt"  # set in build(): mmrun's GPT names, or "transformers" for other modules

    def __init__(self, args: Any, framework: str, log: Callable[[str], None], fsdp2: bool = True) -> None:
        self.args, self.log, self.fsdp2 = args, log, fsdp2
        self.name = "torch-fsdp2" if fsdp2 else "torch-ddp"
        self.layout = ParallelLayout()
        self.model: torch.nn.Module | None = None  # the sharded/wrapped model forward_step gets
        self.module: torch.nn.Module | None = None  # the model itself (FSDP2 shards in place; DDP wraps)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.config: Any = None
        self.plan: Any = None
        self.mesh: Any = None
        self._ignored: list[torch.nn.Parameter] = []
        self._names: dict[torch.nn.Parameter, str] = {}
        self._reported_memory = False

    # ----------------------------------------------------------------------------------- set-up
    def initialize(self, args: Any) -> ParallelLayout:
        if args.fp16:
            # No loss scaler and no fp32 main params here: fp16 would silently lose small updates and overflow.
            raise UsageError(f"--fp16 is not supported by the {self.name} engine (no loss scaling, no fp32 main "
                             "params). Received: --fp16; use --bf16 (MindSpeed-MM's FSDP2 configs train in bf16) "
                             "or fp32")
        from mmrun.backend.torch import process_group

        process_group.start(args.distributed_backend, single_process_group=True,
                            timeout_minutes=args.distributed_timeout_minutes)
        world, rank = dist.get_world_size(), dist.get_rank()
        self.layout = ParallelLayout(world_size=world, dp=world, dp_rank=rank)
        if self.fsdp2:
            from mmrun.engines.fsdp2_config import check_with_training_args, load_fsdp2_config

            if not getattr(args, "fsdp2_config_path", None):
                self.config = load_config_defaults()
            else:
                self.config = load_fsdp2_config(args.fsdp2_config_path)
            check_with_training_args(self.config, vars(args))
            self.config.shard_size(world)  # a sharding_size that does not divide the world: exit 2 now
        return self.layout

    def _device(self) -> torch.device:
        from mmrun.backend.torch import device

        return device.default_device()

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        from mmrun.backend.optimizer_params import megatron_no_decay

        args = self.args
        self.scheduler = scheduler
        model = model_provider(pre_process=True, post_process=True)
        if not isinstance(model, torch.nn.Module):
            raise TrainingError(f"the {self.name} engine trains torch modules; model_provider returned "
                                f"{type(model).__name__}")
        self.model_names = "mmrun-gpt" if type(model).__module__ == "mmrun.models.gpt" else "transformers"
        model = model.to(self._device())
        for module in model.modules():  # mmrun's VLMs: torch's AdamW skips a parameter without a gradient, so one
            if hasattr(module, "blank_vision_on_one_process"):  # process too runs the ViT of a text-only batch
                module.blank_vision_on_one_process = True
        self.module = model
        precision = "bf16" if args.bf16 else "fp16" if args.fp16 else None
        if self.fsdp2:
            self._shard(model, precision)
            self.model = model
        else:
            if precision:
                model.to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[precision]))
            ddp = dist.get_world_size() > 1
            self.model = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
            self.log(f"> torch DDP over {dist.get_world_size()} rank(s)" if ddp else "> one process, no DDP")
        self._names = {p: n for n, p in model.named_parameters()}  # after fully_shard: it swaps in DTensor parameters
        decay = [p for n, p in model.named_parameters() if p.requires_grad and not megatron_no_decay(n, p)]
        no_decay = [p for n, p in model.named_parameters() if p.requires_grad and megatron_no_decay(n, p)]
        cpu = self._device().type == "cpu"
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}], lr=args.lr,
            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, weight_decay=args.weight_decay,
            foreach=False if cpu else None)

    def _shard(self, model: torch.nn.Module, precision: str | None) -> None:
        from mmrun.backend.torch import device
        from mmrun.engines.torch.fsdp2.sharding import apply_fsdp2, build_mesh, ignored_parameters
        from mmrun.engines.fsdp2_config import plan_modules

        world = dist.get_world_size()
        if self.model_names == "mmrun-gpt":
            import warnings

            # mmrun's GPT returns a reshaped (view) loss and its loss_func is out of place, so FSDP2's
            # warning about in-place ops on a view output cannot apply.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        classes = {n: f"{type(m).__module__}.{type(m).__qualname__}" for n, m in model.named_modules()}
        self.plan = plan_modules(self.config, [n for n, _ in model.named_modules()], classes,
                                 aliases=getattr(model, "mindspeed_mm_modules", None))
        shard = self.config.shard_size(world)
        self.mesh = build_mesh(device.detect().kind, world, shard)
        from mmrun.engines.torch.fsdp2.experts import expert_parallel

        from mmrun.engines.torch.fsdp2.sharding import TORCH_DTYPES, unit_kwargs

        param_dtype = self.config.param_dtype or precision
        self._experts = expert_parallel(model, self.config, self.plan, device.detect().kind, world,
                                        TORCH_DTYPES[param_dtype] if param_dtype else None,
                                        unit_kwargs(self.config, precision))
        fsdp_plan = self.plan if self._experts is None else dataclasses.replace(  # split experts: not FSDP's
            self.plan, ignore=[*self.plan.ignore, *self.plan.moe])
        units = apply_fsdp2(model, self.config, fsdp_plan, self.mesh, default_param_dtype=precision)
        self._ignored = ignored_parameters(model, self.plan)
        moe = "" if not self.plan.moe else (f"; {self._experts.summary()}"
                                            if self._experts is not None else
                                            f"; {len(self.plan.moe)} expert module(s) (moe_modules, "
                                            "expert_parallel_size 1) sharded in their unit")
        self.log(f"> FSDP2 (torch fully_shard) over {world} rank(s): {self.config.summary(world)}; "
                 f"{len(units) - 1} unit(s) + root, {len(self.plan.recompute)} recomputed, "
                 f"{len(self.plan.ignore)} ignored module(s){moe}")

    def parameter_count(self) -> int:
        return int(sum(p.numel() for p in self.module.parameters()))

    def local_parameter_count(self) -> int:
        """Parameters this rank stores (its shards; ignored parameters whole)."""
        return int(sum(_local(p).numel() for p in self.module.parameters()))

    def local_state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds of the parameters, their gradients and the optimizer state (its shards under
        FSDP2, whole tensors under DDP), measured from the tensors themselves."""
        def size(t: Any) -> int:
            t = _local(t)
            return t.numel() * t.element_size() if torch.is_tensor(t) else 0

        params = list(self.module.parameters())
        optimizer = sum(size(v) for state in self.optimizer.state.values() for v in state.values())
        return {"parameters": sum(size(p) for p in params),
                "gradients": sum(size(p.grad) for p in params if p.grad is not None), "optimizer": optimizer}

    def device(self) -> str:
        return str(_local(next(iter(self.module.parameters()))).device)

    # ----------------------------------------------------------------------------------- steps
    def _set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = self.args.weight_decay * group.get("wd_mult", 1.0)

    def _sync_context(self, last: bool) -> Any:
        """Gradients are reduced once per step, on the last micro-batch (they accumulate locally before)."""
        import contextlib

        if self.fsdp2:
            self.model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _reduce(self, totals: dict[str, list[float]]) -> dict[str, float]:
        keys = sorted(totals)
        flat = torch.tensor([v for k in keys for v in totals[k]], dtype=torch.float64)
        if dist.get_world_size() > 1:
            flat = flat.to(self._comm_device())
            dist.all_reduce(flat)
            flat = flat.cpu()
        return {k: float(flat[2 * i] / flat[2 * i + 1]) for i, k in enumerate(keys)}

    def _comm_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self._device()

    def _average_ignored_grads(self) -> None:
        """FSDP2 leaves ignored parameters alone, their gradients too: average them over the ranks here."""
        grads = [p.grad for p in self._ignored if p.grad is not None]
        if not grads or dist.get_world_size() == 1:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _clip(self) -> float:
        params = [p for p in self.module.parameters() if p.grad is not None]
        norms = [torch.linalg.vector_norm(p.grad.detach().float()) for p in params]
        from torch.distributed.tensor import DTensor

        squares = torch.zeros((), dtype=torch.float32, device=self._device())
        for norm in norms:
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            squares = squares + norm.to(squares.device) ** 2
        total = float(torch.sqrt(squares))
        clip = self.args.clip_grad
        if clip and clip > 0 and math.isfinite(total):
            coefficient = min(1.0, clip / (total + 1e-6))
            if coefficient < 1.0:
                for p in params:
                    p.grad.detach().mul_(coefficient)
        return total

    def train_step(self, forward_step_func: Callable, data_iterators: Sequence[Iterator]) -> StepResult:
        args = self.args
        lr = float(self.scheduler.get_lr())
        self._set_learning_rate(lr)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, list[float]] = {}
        n = args.num_micro_batches
        for i in range(n):
            with self._sync_context(i == n - 1):
                output, loss_func = _check_forward_step(forward_step_func(data_iterators[0], self.model))
                result = loss_func(output)
                (_objective(result) / n).backward()
            for key, (num, den) in _report_pairs(result).items():
                acc = totals.setdefault(key, [0.0, 0.0])
                acc[0] += num
                acc[1] += den
        self._average_ignored_grads()
        if getattr(self, "_experts", None) is not None:
            self._experts.finish_expert_grads()
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step(args.global_batch_size)
        loss = self._reduce(totals).get("lm loss", float("nan"))
        if not self._reported_memory:  # once, after the first step has made the optimizer state
            self._reported_memory = True
            mb = {k: v / 2**20 for k, v in self.local_state_bytes().items()}
            self.log(f"> {self.name} state on rank 0 after the first step: parameters {mb['parameters']:.2f} MB, "
                     f"gradients {mb['gradients']:.2f} MB, optimizer {mb['optimizer']:.2f} MB")
        return StepResult(loss, grad_norm, lr, False, None)

    def evaluate(self, forward_step_func: Callable, data_iterators: Sequence[Iterator],
                 eval_iters: int) -> dict[str, float]:
        totals: dict[str, list[float]] = {}
        self.model.eval()
        try:
            with torch.no_grad():
                for _ in range(eval_iters * self.args.num_micro_batches):
                    output, loss_func = _check_forward_step(forward_step_func(data_iterators[0], self.model))
                    for key, (num, den) in _report_pairs(loss_func(output)).items():
                        acc = totals.setdefault(key, [0.0, 0.0])
                        acc[0] += num
                        acc[1] += den
        finally:
            self.model.train()
        return self._reduce(totals)

    # ------------------------------------------------------------------------------ checkpoints
    def _full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The whole model and optimizer state (collective; every rank gets it on the host)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(self.module, self.optimizer, options=options)

    def checkpoint_state(self) -> ShardState | None:
        """--ckpt-format safetensors: the whole model, AdamW moments as `<param>.exp_avg`/`.exp_avg_sq`."""
        model_sd, optim_sd = self._full_state()
        if dist.get_rank() != 0:
            return None
        model = {k: _numpy(v) for k, v in model_sd.items() if torch.is_tensor(v)}
        tensors, step = optimizer_tensors(optim_sd)
        return ShardState(model=model, optimizer={"step": step, "lr": float(self.optimizer.param_groups[0]["lr"]),
                                                  "tensors": tensors}, meta={"grad_scaler": None})

    def expected_shapes(self) -> tuple[dict, dict, dict]:
        shapes = {n: tuple(p.shape) for n, p in self.module.state_dict().items() if torch.is_tensor(p)}
        params = {n: tuple(p.shape) for n, p in self.module.named_parameters() if p.requires_grad}
        return shapes, {f"{n}.{k}": s for n, s in params.items() for k in ("exp_avg", "exp_avg_sq")}, {}

    def load_checkpoint_state(self, state: ShardState, load_optimizer: bool) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        model_sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.model.items()}
        options = StateDictOptions(full_state_dict=True)
        if load_optimizer and state.optimizer is not None:
            optim_sd = optimizer_state_from_tensors(state.optimizer["tensors"], int(state.optimizer["step"]),
                                                    self.optimizer, self._names)
            set_state_dict(self.module, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                           options=options)
        else:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.module, model_sd, options=options)

    # torch.distributed.checkpoint (--ckpt-format torch_dcp)
    def save_dcp(self, directory: str, with_optimizer: bool = True) -> None:
        from mmrun.backend.torch.fsdp2 import dcp

        dcp.save(directory, self.module, self.optimizer if with_optimizer else None)

    def load_dcp(self, directory: str, with_optimizer: bool = True) -> None:
        from mmrun.backend.torch.fsdp2 import dcp

        dcp.load(directory, self.module, self.optimizer if with_optimizer else None)

    def hf_config(self) -> dict[str, Any] | None:
        """A transformers model's config.json as JSON (kept in DCP checkpoints for the HF converter)."""
        import json

        config = getattr(self.module, "config", None)
        return json.loads(config.to_json_string()) if hasattr(config, "to_json_string") else None

    def rng_state(self) -> dict[str, Any] | None:
        return None

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Nothing beyond the backend's seeding (saved by the checkpoint itself)."""


def load_config_defaults() -> Any:
    """--use-torch-fsdp2 without a file: every key at its default (the root alone is one unit)."""
    from mmrun.engines.fsdp2_config import config_from_mapping

    return config_from_mapping({}, "--use-torch-fsdp2 (no --fsdp2-config-path: defaults)")


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def optimizer_tensors(optim_sd: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """torch's FQN-keyed optimizer state -> mmrun's flat `<param>.exp_avg` arrays and the step count."""
    tensors, step = {}, 0
    for fqn, state in optim_sd.get("state", {}).items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"{fqn}.{key}"] = _numpy(state[key])
        if "step" in state:
            step = int(float(state["step"]))
    return tensors, step


def optimizer_state_from_tensors(tensors: Mapping[str, np.ndarray], step: int, optimizer: torch.optim.Optimizer,
                                 names: Mapping[torch.nn.Parameter, str]) -> dict[str, Any]:
    """mmrun's flat optimizer arrays -> the FQN-keyed state dict set_state_dict takes."""
    state = {}
    for fqn in names.values():
        if f"{fqn}.exp_avg" in tensors:
            state[fqn] = {"step": torch.tensor(float(step)),
                          "exp_avg": torch.from_numpy(np.ascontiguousarray(tensors[f"{fqn}.exp_avg"])),
                          "exp_avg_sq": torch.from_numpy(np.ascontiguousarray(tensors[f"{fqn}.exp_avg_sq"]))}
    groups = []
    for group in optimizer.param_groups:
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [names[p] for p in group["params"]]})
    return {"state": state, "param_groups": groups}


def create_fsdp2(args: Any, framework: str, log: Callable[[str], None]) -> TorchNativeEngine:
    return TorchNativeEngine(args, framework, log, fsdp2=True)


def create_ddp(args: Any, framework: str, log: Callable[[str], None]) -> TorchNativeEngine:
    return TorchNativeEngine(args, framework, log, fsdp2=False)
