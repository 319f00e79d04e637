"""The MindSpore engine (engines/mindspore/parallel/gpt.py + backend/mindspore/parallel) trained under msrun on the same
weights and micro-batches as mcore_reference.py; writes the same result files."""
from __future__ import annotations

import numpy as np

import parity_setup as setup
from mmrun import backend


def main() -> None:
    args = setup.arguments()
    backend.init_distributed()
    backend.seeding.seed_everything(setup.WEIGHTS_SEED)
    from mmrun.backend.mindspore import optim, tensors
    from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep
    from mmrun.backend.mindspore.parallel.groups import initialize_model_parallel
    from mmrun.models.gpt import GPTConfig
    from mmrun.engines.mindspore.parallel.gpt import GPTModel, init_weights

    state = initialize_model_parallel(args.tp, args.pp, args.sequence_parallel)
    sizes = setup.SIZES
    config = GPTConfig(num_layers=sizes["num_layers"], hidden_size=sizes["hidden_size"],
                       num_attention_heads=sizes["num_attention_heads"], ffn_hidden_size=sizes["ffn_hidden_size"],
                       vocab_size=sizes["vocab_size"], max_position_embeddings=sizes["max_position_embeddings"],
                       seq_length=setup.SEQ, hidden_dropout=args.dropout, attention_dropout=args.dropout,
                       init_method_std=setup.INIT_STD, dropout_impl="hash",
                       untie_embeddings_and_output_weights=args.untie)
    model = GPTModel(config, state)
    init_weights(model, setup.WEIGHTS_SEED, setup.INIT_STD)
    opt = setup.OPTIMIZER
    optimizer = optim.AdamW(model.named_parameters(), lr=opt["lr"], betas=(opt["adam_beta1"], opt["adam_beta2"]),
                            eps=opt["adam_eps"], weight_decay=opt["weight_decay"], no_decay=optim.megatron_no_decay)
    engine = ParallelTrainStep(model, optimizer, state, clip_grad=opt["clip_grad"], jit=args.jit == "on")
    extra = {}
    if args.dropout > 0:
        # The first step's loss with dropout off (evaluate runs the model in eval mode, drawing no masks):
        # the test's proof that dropout changed the training loss, without a second job.
        extra["eval_loss"] = engine.evaluate(setup.micro_batches(0, args.micro_batches, state.dp_rank,
                                                                 state.data_parallel_size))
    losses, norms, grads = [], [], {}
    for iteration in range(args.iters):
        batches = setup.micro_batches(iteration, args.micro_batches, state.dp_rank, state.data_parallel_size)
        loss, step_grads = engine.compute_gradients(batches)
        if iteration == 0:
            grads = {n: tensors.to_numpy(g) for n, g in zip(optimizer.names, step_grads)}
        result = engine.apply_gradients(step_grads, loss)
        losses.append(result.loss)
        norms.append(result.grad_norm)
    params = model.rank_state_dict()
    setup.write_result(args.out_dir, state.rank, {
        "framework": "mindspore", "tp_rank": state.tp_rank, "pp_rank": state.pp_rank, "dp_rank": state.dp_rank,
        "losses": losses, "grad_norms": norms, "shapes": {n: list(v.shape) for n, v in params.items()},
        "final_params_sum": {n: float(np.sum(np.abs(v))) for n, v in params.items()}, **extra}, grads)


if __name__ == "__main__":
    main()
