"""megatron-core's GPTModel trained on PyTorch CPU under torchrun: the reference the MindSpore engine must equal.

megatron-core 0.16 builds the model, its parallel state (tp-cp-ep-dp-pp), DDP, the 1F1B schedule
(get_forward_backward_func), finalize_model_grads and its optimizer (torch AdamW, Megatron's grad-norm
clipping). The CPU shims below are the ones /work/shared/notes/torch-npu-megatron.md lists, for this script only.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

import parity_setup as setup


class _CudaToCpu(TorchFunctionMode):
    """megatron-core hard-codes device="cuda" in buffers, the schedule and the optimizer."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and "cuda" in str(device):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _cpu_shims() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    import megatron.core.optimizer.optimizer as mopt

    def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
        # Megatron's own, without its torch.cuda.FloatTensor assertion: scale when the coefficient is below 1.
        coeff = max_norm / (total_norm + 1.0e-6)
        if coeff < 1.0:
            for p in parameters:
                if p.grad is not None:
                    p.grad.mul_(coeff)

    mopt.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32

    import megatron.core.transformer.torch_norm as torch_norm

    def layer_norm(cls, config, hidden_size, eps=1e-5, **_):
        # The local spec's LayerNorm is torch's when Apex is missing, and it refuses --sequence-parallel. Apex's
        # FusedLayerNorm is torch's LayerNorm plus the `sequence_parallel` attribute on its parameters, which
        # tells finalize_model_grads to sum their gradients over the TP group: the same here.
        norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm

    torch_norm.WrappedTorchNorm.__new__ = layer_norm


def main() -> None:
    args = setup.arguments()
    _cpu_shims()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with _CudaToCpu():
        run(args, rank, world)
    dist.destroy_process_group()


def run(args, rank: int, world: int) -> None:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(args.tp, args.pp)
    tensor_parallel.model_parallel_cuda_manual_seed(1, inference_rng_tracker=True)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    dp_rank, dp = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    sizes = setup.SIZES
    config = TransformerConfig(
        num_layers=sizes["num_layers"], hidden_size=sizes["hidden_size"],
        num_attention_heads=sizes["num_attention_heads"], ffn_hidden_size=sizes["ffn_hidden_size"],
        hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5, init_method_std=setup.INIT_STD,
        use_cpu_initialization=True, perform_initialization=True,  # False would also skip the tensor_model_parallel attributes the grad norm reads
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        sequence_parallel=args.sequence_parallel, pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=sizes["vocab_size"], max_sequence_length=sizes["max_position_embeddings"],
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=not args.untie)
    shard = setup.layout(args.untie).shard(setup.full_weights(args.untie), args.tp, args.pp, tp_rank, pp_rank)
    result = model.load_state_dict({k: torch.from_numpy(v) for k, v in shard.items()}, strict=False)
    assert not result.unexpected_keys and all(k.endswith("_extra_state") for k in result.missing_keys), result
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), module=model)
    opt = setup.OPTIMIZER
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=opt["lr"], weight_decay=opt["weight_decay"], adam_beta1=opt["adam_beta1"],
        adam_beta2=opt["adam_beta2"], adam_eps=opt["adam_eps"], clip_grad=opt["clip_grad"]), [ddp])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = ddp.no_sync
    forward_backward = get_forward_backward_func()
    causal = torch.triu(torch.ones(setup.SEQ, setup.SEQ, dtype=torch.bool), 1)[None, None]

    def loss_func(loss_mask, output_tensor):
        losses = output_tensor.float().reshape(-1)
        mask = loss_mask.reshape(-1)
        loss = torch.sum(losses * mask)
        tokens = mask.sum().to(torch.int)
        return loss, tokens, {"lm loss": (loss / torch.clamp(tokens, min=1)).detach()}

    def forward_step(data_iterator, model):
        tokens, positions, labels, mask = (torch.from_numpy(a) for a in next(data_iterator))
        return model(tokens, positions, causal, labels=labels), functools.partial(loss_func, mask)

    losses, norms, grads = [], [], {}
    names = {id(p): n for n, p in model.named_parameters()}
    for iteration in range(args.iters):
        for group in optimizer.param_groups:  # what Megatron's OptimizerParamScheduler sets each step
            group["lr"] = opt["lr"]
            group["weight_decay"] = opt["weight_decay"] * group["wd_mult"]
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        batches = setup.micro_batches(iteration, args.micro_batches, dp_rank, dp)
        reports = forward_backward(forward_step_func=forward_step, data_iterator=iter(batches), model=[ddp],
                                   num_microbatches=len(batches), seq_length=setup.SEQ,
                                   micro_batch_size=setup.MICRO_BATCH, forward_only=False)
        if iteration == 0:
            grads = {names[id(p)]: p.main_grad.detach().numpy().copy() for p in model.parameters()}
        _, norm, _ = optimizer.step()
        local = torch.tensor([float(np.mean([r["lm loss"].item() for r in reports])) if reports else 0.0])
        dist.all_reduce(local, group=parallel_state.get_data_parallel_group())
        dist.all_reduce(local, group=parallel_state.get_pipeline_model_parallel_group())  # 0 on other stages
        losses.append(local.item() / dp)
        norms.append(float(norm))
    params = {n: p.detach().numpy().tolist() for n, p in model.named_parameters()}
    setup.write_result(args.out_dir, rank, {
        "framework": "pytorch", "tp_rank": tp_rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "losses": losses,
        "grad_norms": norms, "shapes": {n: list(p.shape) for n, p in model.named_parameters()},
        "final_params_sum": {n: float(np.sum(np.abs(v))) for n, v in params.items()}}, grads)


if __name__ == "__main__":
    main()
