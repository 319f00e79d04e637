"""Pretrain a GPT, Megatron-LM style, on PyTorch or MindSpore: the same file, the same arguments.

    mmrun --ai-framework pytorch   --nproc-per-node 2 models/pretrain_gpt.py --mock-data --train-iters 20
    mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_gpt.py --mock-data --train-iters 20
    python -m mmrun.models.pretrain_gpt --mock-data --train-iters 20        # one process, no launcher
    mmrun --nproc-per-node 4 models/pretrain_gpt.py --mock-data --train-iters 20 --use-mcore-models \
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2    # megatron-core on PyTorch

This is Megatron's pretrain_gpt.py: five callbacks that the shared loop (`mmrun.training.pretrain`)
calls. To train your own model, replace the callbacks; nothing else.

    model_provider                       builds the model
    train_valid_test_datasets_provider   builds the train / validation / test datasets
    get_batch                            turns the next micro-batch into tensors
    forward_step                         runs the model on it, returns (output, loss function)
    loss_func                            reduces the output to a loss

The arguments are Megatron's (--num-layers, --hidden-size, --micro-batch-size, --global-batch-size,
--lr, --data-path, --save, --load, ...; see --help and docs/training.md). Megatron requires the model
sizes; this entry fills in a tiny CPU-sized GPT for whatever is not given (CPU_DEFAULTS).

With --use-mcore-models (PyTorch) the model is megatron-core's GPTModel, the same network starting from
the same weights, and the tensor/pipeline/context-parallel flags split it (docs/parallelism.md); get_batch
then reads data only on the first and last pipeline stages, as Megatron's does. On MindSpore the same flags
train megatron-core's GPTModel rebuilt on MindSpore (docs/parallelism-mindspore.md); that engine reads the
micro-batches itself and calls none of these callbacks.
"""
from functools import partial

from mmrun.backend import ops, tensors
from mmrun.data.gpt_dataset import build_train_valid_test_datasets
from mmrun.models.gpt_names import mmrun_initial_weights
from mmrun.models.gpt import GPT, GPTConfig
from mmrun.training import (ModelType, core_gpt_model, get_args, get_batch_on_this_cp_rank, get_tokenizer,
                            is_first_or_last_pipeline_stage, model_vp_stage, pretrain, print_rank_0)

# Used only for arguments left out of the command line (Megatron's `args_defaults`).
CPU_DEFAULTS = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "micro_batch_size": 4,
    "lr": 1.0e-3,
}


def init_weights(model, seed, std, num_layers):
    """Megatron's init (the same as GPT's own), drawn with numpy rather than the framework's RNG, so
    that one --seed gives bit-identical weights on PyTorch, on MindSpore and in megatron-core's GPTModel:
    N(0, std) for weights, N(0, std / sqrt(2 * num_layers)) for the two output projections of each
    block, zero biases, LayerNorm weight 1. Parameters are drawn in name order (models/gpt_names.py)."""
    state = tensors.state_dict_to_numpy(model.state_dict())
    shapes = {name: array.shape for name, array in state.items()}
    model.load_state_dict(tensors.state_dict_from_numpy(dict(mmrun_initial_weights(shapes, seed, std, num_layers))))


def model_provider(pre_process=True, post_process=True, vp_stage=None):
    """Build the model: mmrun's GPT-2 style decoder, or with --use-mcore-models megatron-core's GPTModel
    for this pipeline stage (pre/post_process: it holds the embeddings / the output layer and loss)."""
    args = get_args()
    if args.use_mcore_models:
        print_rank_0("building GPT model (megatron-core GPTModel) ...")
        return core_gpt_model(pre_process, post_process, vp_stage)
    print_rank_0("building GPT model ...")
    config = GPTConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size,
        vocab_size=args.padded_vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        seq_length=args.seq_length,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.norm_epsilon,
        init_method_std=args.init_method_std,
        untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
        dropout_impl=args.dropout_impl,
    )
    model = GPT(config)
    init_weights(model, args.seed, args.init_method_std, args.num_layers)
    return model


def get_batch(data_iterator, vp_stage=None):
    """Generate a batch: tokens, labels, loss_mask, attention_mask, position_ids.

    Only the first and last pipeline stages read data (the others get activations from their
    neighbours); with context parallelism each rank keeps its share of the sequence. The loader yields
    numpy arrays [micro_batch, seq_length]; here they become tensors of the chosen framework on this
    process's device (from pinned memory, without waiting for the copy, on a GPU/NPU). attention_mask
    is None: the model applies the causal mask itself.
    """
    if not is_first_or_last_pipeline_stage(vp_stage):
        return None, None, None, None, None
    data = get_batch_on_this_cp_rank(next(data_iterator))
    tokens = tensors.from_numpy(data["tokens"])
    labels = tensors.from_numpy(data["labels"])
    loss_mask = tensors.from_numpy(data["loss_mask"])
    position_ids = tensors.from_numpy(data["position_ids"])
    return tokens, labels, loss_mask, None, position_ids


def loss_func(loss_mask, output_tensor):
    """Loss function: the masked sum of per-token losses and the number of tokens it covers.

    Returns (loss, num_tokens, {"lm loss": (loss, num_tokens)}) as Megatron does: the loop divides
    by num_tokens for the gradient and reports sum / count over all micro-batches and ranks.
    """
    losses = ops.reshape(output_tensor, (-1,))
    loss_mask = ops.reshape(loss_mask, (-1,))
    loss = ops.sum(losses * loss_mask)
    num_tokens = ops.sum(loss_mask)
    return loss, num_tokens, {"lm loss": (loss, num_tokens)}


def forward_step(data_iterator, model):
    """Forward training step: the model's per-token losses, and the loss function to reduce them."""
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, model_vp_stage(model))
    if get_args().use_mcore_models:
        output_tensor = model(tokens, position_ids, attention_mask, labels=labels)
    else:
        output_tensor = model(tokens, position_ids, labels=labels)
    return output_tensor, partial(loss_func, loss_mask)


def train_valid_test_datasets_provider(train_val_test_num_samples):
    """Build the train, validation and test datasets (Megatron's GPT datasets, or --mock-data)."""
    args = get_args()
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
        data_prefix=args.data_path,
        split=args.split,
        seq_length=args.seq_length,
        seed=args.seed,
        num_samples=train_val_test_num_samples,
        tokenizer=get_tokenizer(),
        mock=args.mock_data,
        eod_mask_loss=args.eod_mask_loss,
        reset_position_ids=args.reset_position_ids,
    )
    print_rank_0("> finished creating GPT datasets ...")
    return train_ds, valid_ds, test_ds


if __name__ == "__main__":
    pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        args_defaults=CPU_DEFAULTS,
    )
