"""The megatron-core engine: tensor, pipeline (incl. virtual), context and data parallelism on PyTorch.

What mmrun's training loop (training/pretrain.py) gets from megatron-core, as Megatron-LM's training.py
uses it:

- parallel state: `parallel_state.initialize_model_parallel(tp, pp, vpp, context_parallel_size=cp)`
  (rank order tp-cp-ep-dp-pp), then Megatron's seeds (seed + 100 x pipeline rank; the tensor-parallel
  RNG stream from `model_parallel_cuda_manual_seed`);
- the model: the entry's `model_provider(pre_process, post_process, vp_stage)` per model chunk
  (virtual stage), `Float16Module` for --fp16/--bf16, megatron-core's `DistributedDataParallel`
  (gradients reduced in fp32; --use-distributed-optimizer shards them with reduce-scatter);
- the optimizer: `get_megatron_optimizer` (torch's AdamW with Megatron's no-decay groups, gradient
  clipping over all model-parallel ranks, fp32 main params and Megatron's loss scaler for fp16/bf16,
  DistributedOptimizer when asked); the learning rate comes from mmrun's schedule every step;
- the schedule: `get_forward_backward_func()` (no pipelining, 1F1B, or interleaved 1F1B) with the
  entry's own `forward_step(data_iterator, model)`, called per micro-batch and stage; then
  `finalize_model_grads` (data-parallel reduction, tied-embedding and sequence-parallel all-reduces).

The train loss and validation losses are reduced as Megatron does (sum / count over micro-batches and
data x context-parallel ranks, on the last pipeline stage) and broadcast to every rank, so rank 0 logs
them. Checkpoint shards are GPTModel's own state_dict() names per (tensor, pipeline) rank, `model<v>.`
before them for virtual stages, optimizer state per parameter (optimizer_state.py).
"""
from __future__ import annotations

import inspect
import random
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from mmrun.backend import object_codec
from mmrun.backend.train_step_shared import StepResult
from mmrun.backend.torch.megatron_core import runtime
from mmrun.engines.torch.megatron_core import gloo_uneven, optimizer_state
from mmrun.engines.base import ParallelLayout, ShardState, TrainingError


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DistributedDataParallel and Float16Module."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _megatron_loss(loss_func: Callable) -> Callable:
    """The entry's loss_func as Megatron's schedules want it. They add the token counts up as integers
    (mmrun's portable loss_func returns floats: MindSpore's jit wants one dtype) and divide the loss in
    place, so a report that holds the loss tensor itself (mmrun's `(loss, num_tokens)`) gets a detached
    copy, as Megatron's own loss_func makes (`loss.clone().detach()`)."""
    def loss(output_tensor: torch.Tensor) -> Any:
        result = loss_func(output_tensor)
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            # (loss, report) whose report holds the loss tensor itself (the VLM entry's): the schedule divides
            # the loss by the micro-batch count in place, so the report gets its own copy first
            return result[0], {k: _report_tensor(v) for k, v in result[1].items()}
        if not (isinstance(result, tuple) and len(result) == 3):
            return result
        value, num_tokens, report = result
        if torch.is_tensor(num_tokens) and num_tokens.is_floating_point():
            num_tokens = num_tokens.detach().round().to(torch.int)
        if isinstance(report, dict):
            report = {k: _report_tensor(v) for k, v in report.items()}
        return value, num_tokens, report
    return loss


def _report_tensor(value: Any) -> torch.Tensor:
    """A report entry -> a new tensor([sum, count]) in float64 on the host: Megatron's 2-element tensor,
    mmrun's (sum, count), or a plain value (count 1)."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return torch.stack([torch.as_tensor(v).detach().double().reshape(()).cpu() for v in value])
    flat = torch.as_tensor(value).detach().double().reshape(-1).cpu()
    return flat[:2].clone() if flat.numel() >= 2 else torch.cat([flat, torch.ones(1, dtype=torch.float64)])


class MegatronCoreEngine:
    """engines/base.py's Engine on megatron-core (see the module docstring)."""

    name = "megatron-core"
    model_names = "megatron-core"

    def __init__(self, args: Any, framework: str, log: Callable[[str], None]) -> None:
        self.args, self.log = args, log
        self.layout = ParallelLayout()
        self.chunks: list[torch.nn.Module] = []
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.config: Any = None
        self._param_names: dict[torch.nn.Parameter, str] = {}
        self._experts: Any = None  # a MoE model's ExpertNames (checkpoint names of this rank's experts)

    # ----------------------------------------------------------------------------------- set-up
    def initialize(self, args: Any) -> ParallelLayout:
        from mmrun.backend.torch import process_group

        kind = runtime.prepare()
        process_group.start(args.distributed_backend, single_process_group=True,
                            timeout_minutes=args.distributed_timeout_minutes)
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        ps.initialize_model_parallel(
            tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            distributed_timeout_minutes=args.distributed_timeout_minutes,  # its sub-groups' bound
            virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
            context_parallel_size=args.context_parallel_size,
            # Qwen3-VL MoE's experts (engines/torch/megatron_core/qwen3_vl_moe.py; the feature gate refuses EP elsewhere)
            expert_model_parallel_size=getattr(args, "expert_model_parallel_size", None) or 1,
        )
        if torch.distributed.get_backend() == "gloo":  # its uneven first-dim collectives, padded (gloo_uneven.py)
            gloo_uneven.install()
        # Megatron's _set_random_seed: a different stream per pipeline stage, the TP stream from the tracker.
        seed = args.seed + 100 * ps.get_pipeline_model_parallel_rank()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)
        self.layout = ParallelLayout(
            world_size=torch.distributed.get_world_size(), tp=args.tensor_model_parallel_size,
            pp=args.pipeline_model_parallel_size, vpp=args.virtual_pipeline_model_parallel_size or 1,
            cp=args.context_parallel_size, dp=ps.get_data_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank(),
            cp_rank=ps.get_context_parallel_rank(), dp_rank=ps.get_data_parallel_rank())
        if args.dropout_impl == "hash" and (args.hidden_dropout > 0 or args.attention_dropout > 0):
            self.log("notice: --dropout-impl hash is mmrun's GPT's; megatron-core's GPTModel draws its dropout masks "
                     "with torch's generators (Megatron's tensor-parallel RNG streams), so they differ from mmrun's")
        kernels = runtime.installed_kernels()
        experts = ps.get_expert_model_parallel_world_size()
        self.log(f"> megatron-core {runtime.version()} on {kind}: parallel state "
                 f"{self.layout.describe()}{f', expert-parallel {experts}' if experts > 1 else ''}; Transformer Engine {'found' if kernels['transformer_engine'] else 'absent'}, "
                 f"Apex {'found' if kernels['apex'] else 'absent'}"
                 + ("; CPU shims installed (backend/torch/megatron_core/cpu_shims.py)" if kind == "cpu" else ""))
        notice = runtime.fusion_notice(kind)
        if notice:
            self.log(notice)
        return self.layout

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module
        from megatron.core.utils import get_model_config

        args = self.args
        self.scheduler = scheduler
        takes_vp_stage = "vp_stage" in inspect.signature(model_provider).parameters
        if self.layout.vpp > 1 and not takes_vp_stage:
            raise TrainingError("virtual pipeline stages need model_provider(pre_process, post_process, vp_stage) as "
                                "in Megatron-LM; the entry's model_provider takes no vp_stage. Received: "
                                f"--virtual-pipeline-model-parallel-size {self.layout.vpp}")
        models = []
        for v in range(self.layout.vpp):
            pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v)
            post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v)
            model = model_provider(pre_process=pre, post_process=post, **({"vp_stage": v} if takes_vp_stage else {}))
            if not isinstance(model, torch.nn.Module) or not hasattr(model, "set_input_tensor"):
                raise TrainingError("with the megatron-core engine, model_provider must return a megatron-core model "
                                    f"(GPTModel). Received: {type(model).__name__}; pass --use-mcore-models so "
                                    "models/pretrain_gpt.py builds one")
            if runtime.device_kind() != "cpu":
                model.cuda(torch.cuda.current_device())  # the NPU under transfer_to_npu
            models.append(model)
        self.config = get_model_config(models[0])
        # A model that names its checkpoint tensors otherwise says so (the VLM: MindSpeed-MM's names).
        self.model_names = getattr(models[0], "checkpoint_names", type(self).model_names)
        self._experts = getattr(models[0], "expert_names", None)  # Qwen3-VL MoE: experts in global numbers on disk
        if args.fp16 or args.bf16:
            models = [Float16Module(self.config, m) for m in models]
        # --overlap-grad-reduce / --overlap-param-gather go to megatron-core as Megatron's training.py passes them:
        # bucketed all-reduces started during backward (the schedule skips them on all but the last micro-batch
        # through no_sync_func); the parameter all-gather only exists with the distributed optimizer.
        overlap_gather = bool(getattr(args, "overlap_param_gather", False) and args.use_distributed_optimizer)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                   overlap_grad_reduce=bool(getattr(args, "overlap_grad_reduce", False)),
                                                   overlap_param_gather=overlap_gather,
                                                   use_distributed_optimizer=args.use_distributed_optimizer)
        self.chunks = [DistributedDataParallel(self.config, ddp_config, m, disable_bucketing=i > 0)
                       for i, m in enumerate(models)]
        if ddp_config.overlap_grad_reduce:
            sync = [c.no_sync for c in self.chunks], [c.start_grad_sync for c in self.chunks]
            self.config.no_sync_func, self.config.grad_sync_func = ((f[0] if len(f) == 1 else f) for f in sync)
        if getattr(args, "overlap_param_gather", False) and not overlap_gather:
            self.log("notice: --overlap-param-gather: without --use-distributed-optimizer parameters are not sharded, "
                     "so there is no all-gather to overlap (results identical)")
        for prefix, chunk in self._named_chunks():
            for name, param in _unwrap(chunk).named_parameters():
                if param.requires_grad:  # a frozen part has no optimizer state (the data-parallel engine's rule)
                    self._param_names[param] = self._global(prefix + name)
        opt_config = OptimizerConfig(
            optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
            clip_grad=args.clip_grad, fp16=args.fp16, bf16=args.bf16, params_dtype=self.config.params_dtype,
            loss_scale=args.loss_scale, initial_loss_scale=args.initial_loss_scale,
            min_loss_scale=args.min_loss_scale, loss_scale_window=args.loss_scale_window,
            hysteresis=args.hysteresis, use_distributed_optimizer=args.use_distributed_optimizer)
        self.optimizer = get_megatron_optimizer(opt_config, self.chunks)
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.grad_scale_func = self.optimizer.scale_loss
        if args.fp16 or args.bf16:
            scaler = getattr(self._sub_optimizers()[0], "grad_scaler", None)
            how = ("no loss scaling" if scaler is None else
                   f"dynamic loss scale from {float(scaler.scale):g}" if hasattr(scaler, "hysteresis")
                   else f"constant loss scale {float(scaler.scale):g}")
            self.log(f"> {'fp16' if args.fp16 else 'bf16'} model (Float16Module) with fp32 main params in "
                     f"megatron-core's optimizer, {how}")
        if args.use_distributed_optimizer:
            experts = self._experts is not None and self._experts.active  # megatron-core's second DistOpt
            self.log(f"> distributed optimizer: AdamW state and fp32 gradients sharded over {self.layout.dp} "
                     "data-parallel rank(s)" + (f", the experts' over {ps.get_expert_data_parallel_world_size()} "
                                               "expert-data-parallel rank(s); rank 0 holds "
                                               f"{optimizer_state.held(self.optimizer, self._param_names)}"
                                               if experts else ""))

    def _named_chunks(self) -> list[tuple[str, torch.nn.Module]]:
        return [(f"model{i}." if len(self.chunks) > 1 else "", c) for i, c in enumerate(self.chunks)]

    def _sub_optimizers(self) -> list[Any]:
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def parameter_count(self) -> int:
        return int(sum(p.numel() for c in self.chunks for p in _unwrap(c).parameters()))

    def device(self) -> str:
        first = next(iter(_unwrap(self.chunks[0]).parameters()))
        return str(first.device)

    # ----------------------------------------------------------------------------------- steps
    def _schedule(self, forward_step_func: Callable, data_iterators: Sequence[Iterator], num_micro: int,
                  forward_only: bool) -> list:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Iterator, model: torch.nn.Module) -> Any:
            returned = forward_step_func(data_iterator, model)
            if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
                raise TrainingError("forward_step must return (output_tensor, loss_func) as Megatron's does. "
                                    f"Received: {type(returned).__name__}")
            return returned[0], _megatron_loss(returned[1])

        args = self.args
        iterators = list(data_iterators)
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.chunks, num_microbatches=num_micro, seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size, forward_only=forward_only)

    def _reduce_reports(self, reports: list) -> dict[str, float]:
        """Megatron's loss reduction: sum / count over micro-batches and data x context ranks, computed on
        the last pipeline stage and sent to every stage (only rank 0 logs, but every rank returns it)."""
        from megatron.core import parallel_state as ps

        totals: dict[str, torch.Tensor] = {}
        for report in reports:
            for key, value in (report.items() if isinstance(report, dict) else ()):
                totals[key] = totals.get(key, torch.zeros(2, dtype=torch.float64)) + _report_tensor(value)
        keys = sorted(totals)
        if keys:
            flat = torch.cat([totals[k] for k in keys]).to(self._comm_device())
            torch.distributed.all_reduce(flat, group=ps.get_data_parallel_group(with_context_parallel=True))
            values = {k: float(flat[2 * i] / flat[2 * i + 1]) for i, k in enumerate(keys)}
        else:
            values = {}
        if self.layout.pp > 1:
            values = self._from_last_stage(values)
        return values

    def _comm_device(self) -> torch.device:
        return torch.device("cpu") if runtime.device_kind() == "cpu" else torch.device(torch.cuda.current_device())

    def _from_last_stage(self, values: dict[str, float]) -> dict[str, float]:
        """The last pipeline stage's values on every stage of this pipeline (JSON over two broadcasts)."""
        from megatron.core import parallel_state as ps

        group, src = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_last_rank()
        payload = object_codec.encode(values)
        size = torch.tensor([payload.size], dtype=torch.int64, device=self._comm_device())
        torch.distributed.broadcast(size, src=src, group=group)
        buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=self._comm_device())
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            buffer.copy_(torch.from_numpy(payload.copy()))
        torch.distributed.broadcast(buffer, src=src, group=group)
        return object_codec.decode(buffer.cpu().numpy())

    def _set_learning_rate(self, lr: float) -> None:
        # What Megatron's OptimizerParamScheduler.step writes into each group (no-decay groups: wd_mult 0).
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.args.weight_decay * group.get("wd_mult", 1.0)

    def train_step(self, forward_step_func: Callable, data_iterators: Sequence[Iterator]) -> StepResult:
        args = self.args
        lr = float(self.scheduler.get_lr())
        self._set_learning_rate(lr)
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        reports = self._schedule(forward_step_func, data_iterators, args.num_micro_batches, forward_only=False)
        updated, grad_norm, _ = self.optimizer.step()
        loss_scale = float(self.optimizer.get_loss_scale()) if (args.fp16 or args.bf16) else None
        if updated:
            self.scheduler.step(args.global_batch_size)
        loss = self._reduce_reports(reports).get("lm loss", float("nan"))
        norm = float(grad_norm) if grad_norm is not None else float("nan")
        return StepResult(loss, norm if updated else float("nan"), lr, not updated,
                          loss_scale if args.fp16 or args.loss_scale is not None else None)

    def evaluate(self, forward_step_func: Callable, data_iterators: Sequence[Iterator],
                 eval_iters: int) -> dict[str, float]:
        reports: list = []
        for chunk in self.chunks:
            chunk.eval()
        try:
            with torch.no_grad():
                for _ in range(eval_iters):
                    reports += self._schedule(forward_step_func, data_iterators, self.args.num_micro_batches,
                                              forward_only=True)
        finally:
            for chunk in self.chunks:
                chunk.train()
        return self._reduce_reports(reports)

    # ------------------------------------------------------------------------------ checkpoints
    def _global(self, name: str) -> str:
        """A tensor's checkpoint name: its own, or for an expert of an expert-parallel rank its global number."""
        return name if self._experts is None else self._experts.global_name(name)

    def _every_expert(self, shapes: dict) -> dict:
        """Names of this rank's tensors -> every expert-parallel rank's (the checkpoint holds every expert)."""
        if self._experts is None:
            return shapes
        return {other: shape for name, shape in shapes.items() for other in self._experts.every_rank(name)}

    def _model_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for prefix, chunk in self._named_chunks():
            for name, value in _unwrap(chunk).state_dict().items():
                if torch.is_tensor(value):
                    out[self._global(prefix + name)] = value.detach().float().cpu().numpy() \
                        if value.dtype == torch.bfloat16 else value.detach().cpu().numpy()
        return out if self._experts is None else self._experts.gather(out)

    def _grad_scaler_state(self) -> dict[str, Any] | None:
        scaler = getattr(self._sub_optimizers()[0], "grad_scaler", None)
        if scaler is None:
            return None
        return {k: float(v) if torch.is_tensor(v) else v for k, v in scaler.state_dict().items()}

    def checkpoint_state(self) -> ShardState | None:
        from megatron.core import parallel_state as ps

        if self.chunks[0].ddp_config.overlap_param_gather:  # the last step's all-gather may still be pending
            for chunk in self.chunks:
                chunk.start_param_sync(force_sync=True)

        step, tensors = optimizer_state.gather(self.optimizer, self._param_names,
                                               ps.get_data_parallel_group(with_context_parallel=True),
                                               self.args.use_distributed_optimizer,
                                               ps.get_expert_data_parallel_group() if self._experts else None)
        if self._experts is not None:  # every rank of the expert-parallel group takes part
            tensors = self._experts.gather(tensors)
        model = self._model_arrays()
        if not self.layout.writes_checkpoint:
            return None
        optimizer = {"step": step, "lr": float(self.optimizer.param_groups[0]["lr"]),
                     "tensors": {k: v.numpy() for k, v in tensors.items()}}
        return ShardState(model=model, optimizer=optimizer,
                          meta={"grad_scaler": self._grad_scaler_state()})

    def expected_shapes(self) -> tuple[dict, dict, dict]:
        from mmrun.backend.optimizer_params import MAIN_PARAM_KEY, STATE_KEYS

        model = {name: tuple(a) for name, a in self._model_shapes().items()}
        params = self._every_expert({name: tuple(int(d) for d in p.shape) for p, name in self._param_names.items()})
        optimizer = {f"{n}.{k}": s for n, s in params.items() for k in STATE_KEYS}
        return model, optimizer, {f"{n}.{MAIN_PARAM_KEY}": s for n, s in params.items()}

    def _model_shapes(self) -> dict[str, torch.Size]:
        return self._every_expert({self._global(prefix + name): value.shape for prefix, chunk in self._named_chunks()
                                   for name, value in _unwrap(chunk).state_dict().items() if torch.is_tensor(value)})

    @torch.no_grad()
    def load_checkpoint_state(self, state: ShardState, load_optimizer: bool) -> None:
        for prefix, chunk in self._named_chunks():
            for name, tensor in _unwrap(chunk).state_dict().items():
                if torch.is_tensor(tensor):
                    tensor.copy_(torch.from_numpy(np.ascontiguousarray(state.model[self._global(prefix + name)])).to(
                        tensor.dtype))
        self.optimizer.reload_model_params()  # fp32 main params follow the loaded weights
        if load_optimizer and state.optimizer is not None:
            optimizer_state.restore(self.optimizer, self._param_names, int(state.optimizer["step"]),
                                    state.optimizer["tensors"])
            saved = state.meta.get("grad_scaler")
            if saved:
                for opt in self._sub_optimizers():
                    if getattr(opt, "grad_scaler", None) is not None:
                        opt.grad_scaler.load_state_dict(
                            {k: torch.tensor([v], dtype=torch.float32, device=self._comm_device()) if k == "scale" else v
                             for k, v in saved.items()})

    def rng_state(self) -> dict[str, Any] | None:
        """Megatron's tensor-parallel RNG streams (the tracker's named generator states)."""
        import base64

        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        states = get_cuda_rng_tracker().get_states()
        return {name: base64.b64encode(s.cpu().numpy().tobytes()).decode("ascii") for name, s in states.items()}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        import base64

        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(
            {name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8) for name, text in state.items()})
