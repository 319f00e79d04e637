"""Train a Hugging Face transformers model as it is (MindSpeed-MM's pretrain_transformers.py), PyTorch only.

    # Megatron flags + model.json / data.json, sharded by FSDP2 from a YAML file
    mmrun --nproc-per-node 2 models/pretrain_transformers.py --micro-batch-size 2 --global-batch-size 8 \
        --train-iters 10 --lr 1e-4 --mm-model model.json --mm-data data.json \
        --use-torch-fsdp2 --fsdp2-config-path fsdp2_config.yaml --ckpt-format torch_dcp --save ckpt

    # MindSpeed-MM's single-YAML form: gpt_args (Megatron's arguments, snake_case), data, model
    mmrun --nproc-per-node 2 models/pretrain_transformers.py job.yaml

Without --use-torch-fsdp2 the model trains replicated under torch's DDP. model.json (or the YAML's
`model` section): `init_from_hf_path` (a local Hugging Face directory: config and weights), or
`hf_config` (a config.json mapping: random weights from --seed), `model_id` (a class registered with
`mmrun.engines.torch.transformers_models.register_model`, MindSpeed-MM's ModelHub), `freeze` (module
prefixes whose parameters do not train). data.json (or `data`): `dataset_param.dataset_type`:
`mock` (Megatron's mock GPT samples: --seq-length tokens, --vocab-size), `megatron` (--data-path,
the indexed format), or `huggingface` (MindSpeed-MM's Qwen2-VL data.json: mllm_format JSON + images,
tokenizer and image processor from `preprocess_parameters.model_name_or_path`, mmrun.data.multimodal;
the model must be a Qwen2-VL / Qwen2.5-VL / Qwen3-VL whose token ids are the tokenizer's; MindSpeed-MM's
examples/qwen3vl/qwen3vl_full_sft_8B.yaml runs as it is, docs/qwen3-vl.md). Other pipelines plug in
through DATASET_BUILDERS (datasets or loaders of batch dicts).

The five callbacks are Megatron's, as in models/pretrain_gpt.py; forward_step calls the model with
the batch's own keys (`model(**batch)`), and loss_func reduces its logits to Megatron's
(loss sum, token count) against the labels: next-token labels with loss_mask (Megatron's samples),
or Hugging Face labels (shifted here, -100 ignored).
"""
from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from mmrun.training import ModelSource, ModelType, get_args, pretrain, print_rank_0
from mmrun.training.arguments import ArgumentsError

# Megatron requires these; a transformers model takes its sizes from its config, so they are only
# checked, never used (MindSpeed-MM's model.json says the same of its "megatron check" values).
CPU_DEFAULTS = {
    "num_layers": 1,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "micro_batch_size": 2,
    "lr": 1.0e-4,
    "tokenizer_type": "NullTokenizer",  # the data pipeline tokenizes; Megatron's mock samples need a vocabulary size
    "vocab_size": 512,
}

# dataset_type -> "module:function(args, data_cfg, num_samples) -> (train, valid, test)"; a multimodal
# pipeline adds its row here (the seam for data/multimodal: datasets of batch dicts, or ready loaders).
DATASET_BUILDERS = {
    "mock": "mmrun.models.pretrain_transformers:megatron_gpt_samples",
    "megatron": "mmrun.models.pretrain_transformers:megatron_gpt_samples",
    "huggingface": "mmrun.models.pretrain_transformers:multimodal_samples",  # MindSpeed-MM's Qwen2-VL data.json
}

_MM: dict[str, dict[str, Any]] = {"model": {}, "data": {}}  # the single-YAML form's sections
_MODEL_CONFIG: dict[str, Any] = {}  # the built model's config.json (the data pipeline checks its token ids)


def extra_args(parser):
    # --mm-model (model.json: init_from_hf_path or hf_config, model_id, freeze) and --mm-data (data.json:
    # dataset_param.dataset_type) are declared by the feature table (features/catalogue.yaml, mindspeed-mm-model).
    # Engine choice: torch's DDP unless --use-torch-fsdp2 (engines/__init__.py).
    parser.set_defaults(torch_ddp=True)
    return parser


def _section(name: str) -> dict[str, Any]:
    args = get_args()
    if _MM[name]:
        return _MM[name]
    path = getattr(args, f"mm_{name}")
    if not path:
        return {}
    if str(path).endswith((".yaml", ".yml")):  # the single-YAML form names its own file: its data/model section
        from mmrun.training.yaml_launch import read_yaml_launch

        return getattr(read_yaml_launch(path), name)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ArgumentsError(f"--mm-{name} {path}: cannot read it as JSON ({err}); pass a {name}.json file") from None


def model_provider(pre_process=True, post_process=True, vp_stage=None):
    """The transformers model of model.json (MindSpeed-MM's TransformersModel through its ModelHub)."""
    from mmrun import engines
    from mmrun.engines.model_section import check_model_section

    cfg = _section("model")
    try:
        ignored = check_model_section(cfg)
        model = engines.transformers_model(cfg)
    except engines.ModelConfigError as err:
        raise ArgumentsError(str(err)) from None
    if ignored:
        print_rank_0(f"notice: {ignored}")
    _MODEL_CONFIG.clear()
    _MODEL_CONFIG.update(model.config.to_dict())
    source = cfg.get("init_from_hf_path") or "hf_config (random weights from --seed)"
    if cfg.get("init_from_hf_path"):  # what a --load without a checkpoint starts from (training/checkpointing.py)
        get_args().initial_weights = f"the Hugging Face weights of init_from_hf_path {cfg['init_from_hf_path']}"
    print_rank_0(f"building transformers model {type(model).__name__} from {source} ...")
    return model


def get_batch(data_iterator):
    """The next micro-batch dict as tensors on this device (numpy from the loader). A batch with images or
    videos also gets `mm_token_type_ids` (transformers 5.x's Qwen2-VL forward refuses images without them;
    its processor would return them, mmrun's collate returns position_ids instead)."""
    from mmrun.backend import tensors

    batch = dict(next(data_iterator))
    if "image_grid_thw" in batch or "video_grid_thw" in batch:
        from mmrun.data.multimodal.rope_index import token_types

        batch["mm_token_type_ids"] = token_types(batch["input_ids"], _MODEL_CONFIG["image_token_id"],
                                                 _MODEL_CONFIG["video_token_id"])
    return {key: tensors.from_numpy(value) for key, value in batch.items()}


def loss_func(labels, loss_mask, output_tensor):
    """Megatron's (loss sum, token count, report) from the model's logits."""
    import torch.nn.functional as F

    logits = output_tensor.float()
    if loss_mask is None:  # Hugging Face labels: position t predicts token t+1; -100 is not trained
        logits, labels = logits[:, :-1], labels[:, 1:]
        mask = (labels != -100).float()
    else:
        mask = loss_mask.float()
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).clamp(min=0), reduction="none")
    loss = (losses * mask.reshape(-1)).sum()
    num_tokens = mask.sum()
    return loss, num_tokens, {"lm loss": (loss, num_tokens)}


def forward_step(data_iterator, model):
    """The model on the batch's own keys (labels and loss_mask stay with the loss)."""
    batch = get_batch(data_iterator)
    labels = batch.pop("labels")
    loss_mask = batch.pop("loss_mask", None)
    if "tokens" in batch:  # Megatron's GPT samples
        batch = {"input_ids": batch.pop("tokens"), "position_ids": batch.pop("position_ids", None)}
    output = model(**{k: v for k, v in batch.items() if v is not None})
    return output.logits, partial(loss_func, labels, loss_mask)


def megatron_gpt_samples(args, data_cfg, num_samples):
    from mmrun.data.gpt_dataset import build_train_valid_test_datasets
    from mmrun.training import get_tokenizer

    mock = data_cfg.get("dataset_param", {}).get("dataset_type") == "mock" or args.mock_data
    return build_train_valid_test_datasets(data_prefix=args.data_path, split=args.split, seq_length=args.seq_length,
                                           seed=args.seed, num_samples=num_samples, tokenizer=get_tokenizer(),
                                           mock=mock)


def multimodal_samples(args, data_cfg, num_samples):
    """MindSpeed-MM's Qwen2-VL data.json -> the mllm_format dataset, repeated over epochs in the seed's order
    (dataloader_param.shuffle), collated with M-RoPE positions computed from the model's own config."""
    from mmrun.data.epochs import EpochView
    from mmrun.data.multimodal.collate import collate
    from mmrun.data.multimodal.mllm_dataset import MultimodalDataset
    from mmrun.data.multimodal.rope_index import RopeConfig

    config = _MODEL_CONFIG
    model_type = config.get("model_type")
    if "image_token_id" not in config or "vision_config" not in config:
        raise ArgumentsError(f"data: a multimodal data.json (dataset_type huggingface) needs a vision-language model; "
                             f"the model is {model_type!r} (no image_token_id/vision_config): use a Qwen2-VL, "
                             "Qwen2.5-VL or Qwen3-VL init_from_hf_path")
    dataset = MultimodalDataset(data_cfg["dataset_param"], seq_length=args.seq_length)
    rope = RopeConfig.from_model_config(config)
    ids = dataset.token_ids
    for key, ours, token in (("image_token_id", rope.image_token_id, "image_pad"),
                             ("video_token_id", rope.video_token_id, "video_pad"),
                             ("vision_start_token_id", rope.vision_start_token_id, "vision_start")):
        if ours != ids[token]:
            raise ArgumentsError(f"model: config {key} is {ours} but the tokenizer of data.json gives {token} the id "
                                 f"{ids[token]}; use the model's own tokenizer (preprocess_parameters."
                                 "model_name_or_path) or a config that matches it")
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if vocab is not None and dataset.tokenizer.vocab_size > vocab:
        raise ArgumentsError(f"model: vocab_size {vocab} is smaller than the tokenizer's {dataset.tokenizer.vocab_size} "
                             "tokens of data.json; use the model's own tokenizer")
    loader = data_cfg.get("dataloader_param") or {}
    batch = partial(collate, pad_token_id=ids["pad"], rope_config=rope, max_length=args.seq_length)
    train = EpochView(dataset, num_samples[0], seed=args.seed, shuffle=bool(loader.get("shuffle", True)),
                      collate=batch)
    print_rank_0(f" > {len(dataset)} multimodal samples, {train.num_samples} to read "
                 f"({'shuffled' if train.shuffle else 'in file order'} each epoch, seed {args.seed})")
    return train, None, None


def dataset_kind(data_cfg: dict[str, Any]) -> str:
    """dataset_param.dataset_type; MindSpeed-MM's multimodal data.json (preprocess_parameters) is huggingface."""
    param = data_cfg.get("dataset_param") or {}
    return param.get("dataset_type") or ("huggingface" if "preprocess_parameters" in param else "megatron")


def train_valid_test_datasets_provider(train_val_test_num_samples):
    import importlib

    args = get_args()
    data_cfg = _section("data") or {"dataset_param": {"dataset_type": "mock" if args.mock_data else "megatron"}}
    kind = dataset_kind(data_cfg)
    if kind not in DATASET_BUILDERS:
        raise ArgumentsError(f"data: dataset_type {kind!r} has no builder here; use one of {', '.join(DATASET_BUILDERS)} "
                             "(a multimodal pipeline registers its own in DATASET_BUILDERS)")
    module, _, function = DATASET_BUILDERS[kind].partition(":")
    print_rank_0(f"> building train, validation, and test datasets ({kind}) ...")
    # This entry runs as __main__: its own builders are read from this module (whose globals hold the model's config).
    here = sys.modules[__name__] if module == "mmrun.models.pretrain_transformers" else importlib.import_module(module)
    return getattr(here, function)(args, data_cfg, train_val_test_num_samples)


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith((".yaml", ".yml")):
        from mmrun.training.yaml_launch import read_yaml_launch

        try:
            launch = read_yaml_launch(argv[0])
        except ArgumentsError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        _MM["model"], _MM["data"] = launch.model, launch.data
        argv = launch.argv + ["--mm-model", argv[0], "--mm-data", argv[0]] + argv[1:]
    # The transformers model's structure is its config.json's: with a model file, the launch script's
    # model-structure flags (--swiglu, --normalization RMSNorm, ... in MindSpeed-MM's gpt_args) are ignored
    # with one warning, as pretrain_vlm.py does, instead of refused as for mmrun's GPT.
    source = ModelSource(flag="--mm-model", sizes={}) if any(a in ("--mm-model", "--mm_model") for a in argv) else None
    return pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step,
                    args_defaults=CPU_DEFAULTS, extra_args_provider=extra_args, argv=argv, model_source=source)


if __name__ == "__main__":
    main()
