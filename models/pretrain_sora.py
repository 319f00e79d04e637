"""Train Wan2.1 (text-to-video, image-to-video) from extracted features, MindSpeed-MM style, on PyTorch or MindSpore.

    mmrun --ai-framework pytorch   --nproc-per-node 2 models/pretrain_sora.py $GPT_ARGS \\
        --mm-model pretrain_model.json --mm-data feature_data.json --load Wan2.1-T2V-1.3B-Diffusers/transformer
    mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_sora.py ...     (the same line)
    ... --lora-r 16 --lora-alpha 16 --lora-target-modules ffn.2 ffn.0 proj_q proj_k proj_v proj_out \\
        --lora-register-forward-hook patch_embedding                           (finetune_lora.sh: LoRA)

This is MindSpeed-MM's pretrain_sora.py for its Wan2.1 jobs (examples/wan2.1/*/pretrain.sh, finetune_lora.sh):
the five callbacks of Megatron's contract, run by mmrun's shared loop, with MindSpeed-MM's files as they are:

    --mm-model pretrain_model.json  task t2v|i2v, predictor (model_id wandit: mmrun.models.wan's
                                    WanTransformer3DModel, diffusers' network and names), diffusion
                                    (wan_flow_match_scheduler: models/wan/flow_match.py); both load_*_features true
    --mm-data feature_data.json     dataset_type feature: basic_parameters.data_path (data.jsonl) and data_folder,
                                    one feature file per sample (MindSpeed-MM's .pt or mmrun's .safetensors)
    --mm-tool tools.json            accepted (MindSpeed-MM's tools); checked to be JSON, not used
    --load DIR                      a diffusers `transformer/` directory as downloaded (config.json checked against
                                    the predictor), or mmrun's own checkpoint to resume (either framework's)

The step is MindSpeed-MM's: per micro-batch one timestep drawn from the scheduler's table, x_t = (1 - sigma) * x0
+ sigma * noise, the model predicts noise - x0, loss = MSE in fp32 times the bell-shaped timestep weight. Noise and
timesteps are numpy, keyed by (--seed, the sample's place in the run): both frameworks, any data-parallel size
and a resumed run see the same numbers. Prompt embeddings past the mask are zeroed, as MindSpeed-MM's WanDiT does.

Checkpoints are mmrun's (safetensors, parameter names = diffusers' keys); `mmrun convert WanConverter mm_to_hf`
writes a diffusers directory from one, `lora_to_peft` the adapter in PEFT's layout (checkpoint/wan.py).
Data parallelism on mmrun's engine (both frameworks), or --use-torch-fsdp2 on PyTorch; tensor, pipeline and
context splits of the DiT are refused in one line (pipeline_num_layers with one stage is ignored, as there).
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any, Iterator

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.features.entries import TRAINER_ENTRIES
from mmrun.models.wan.flow_match import flow_match_loss  # at the top: mindspore.jit compiles loss_func
from mmrun.training.entry_io import read_mm_json, say_rank0
from mmrun.training import ModelSource, ModelType, get_args, pretrain, print_rank_0

# Model sizes come from the model json; these fill only what MindSpeed-MM's scripts never set on their own.
# seq_length only sizes the "tokens per second" of the log (a video's patches are its tokens).
CPU_DEFAULTS = {"micro_batch_size": 1, "lr": 1.0e-5, "seq_length": 1024}
# Features this entry implements itself on Wan (the trainer layer of the feature table speaks for the shared training code).
ENTRY_FEATURES = TRAINER_ENTRIES["models/pretrain_sora.py"]
# MindSpeed-MM's --attention-mask-type values this entry runs: `general`, full attention over the video's patches
# (its Wan2.1 scripts pass it; the DiT attends without a mask).
ATTENTION_MASK_TYPES = ("general",)
_SPEC: Any = None  # models.wan.model_json.SoraModelJson, read once before the arguments are parsed


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """MindSpeed-MM's LoRA option that the feature table does not declare (the rest are its companions)."""
    g = parser.add_argument_group("video generation (MindSpeed-MM's pretrain_sora.py)")
    g.add_argument("--lora-register-forward-hook", "--lora_register_forward_hook", dest="lora_register_forward_hook",
                   nargs="+", default=None,
                   help="accepted: MindSpeed-MM hooks these layers so that recomputed blocks after a frozen "
                        "embedding get gradients; mmrun's recomputation needs no hook")
    return parser


def _model_source(argv: list[str]) -> ModelSource:
    """Read --mm-model before the training arguments are parsed: its sizes replace the network flags."""
    global _SPEC
    from mmrun.models.wan.model_json import read_sora_model_json

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--mm-model", "--mm_model", dest="mm_model")
    pre.add_argument("--pipeline-model-parallel-size", "--pipeline_model_parallel_size", dest="pp", type=int,
                     default=1)
    known, _ = pre.parse_known_args(argv)
    if known.mm_model is None:
        raise UsageError("--mm-model is required: pass MindSpeed-MM's pretrain_model.json (task, predictor, "
                         "diffusion)")
    _SPEC = read_sora_model_json(known.mm_model, known.pp)
    config = _SPEC.predictor
    sizes = {"num_layers": config.num_layers, "hidden_size": config.inner_dim,
             "ffn_hidden_size": config.ffn_dim, "num_attention_heads": config.num_attention_heads,
             "vocab_size": 1, "make_vocab_size_divisible_by": 1}  # no vocabulary: the prompt comes embedded
    # ms_jit: a run's feature files share one latent and prompt shape (extraction pads prompts to text_len), so
    # MindSpore compiles the step once per shape (each compile printed) instead of running it in PyNative
    return ModelSource(flag="--mm-model", sizes=sizes, data_flag="--mm-data", data_parallel_only=True,
                       ms_jit=True, features=ENTRY_FEATURES)


# ----------------------------------------------------------------------------------------------- model

def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: Any = None) -> Any:
    """The Wan DiT of the model json, from --load's diffusers weights when it is a diffusers directory (else from
    the seed's weights), with LoRA adapters when --lora-target-modules is given (then only they train)."""
    from mmrun.models.wan import transformer

    args = get_args()
    mask_type = getattr(args, "attention_mask_type", None)
    if mask_type is not None and mask_type not in ATTENTION_MASK_TYPES:
        raise UsageError(f"--attention-mask-type {mask_type}: the Wan DiT attends to every patch "
                         f"({', '.join(ATTENTION_MASK_TYPES)}); pass general or drop the flag")
    config = _SPEC.predictor
    print_rank_0(f"building Wan2.1 {_SPEC.task} transformer from {_SPEC.path} ...")
    model = transformer.WanTransformer3DModel(config)
    if args.load and transformer.is_diffusers_directory(args.load):
        _check_diffusers_config(args.load, config)
        weights = transformer.DiffusersWeights(args.load, config)  # read a tensor at a time
        transformer.load_diffusers_weights(model, weights)
        print_rank_0(f" > loaded diffusers weights from {args.load} ({len(weights)} tensors); training starts at "
                     "iteration 0")
        args.load = None  # nothing of the loop's own checkpoint layout to resume from
    else:
        transformer.init_weights(model, args.seed)  # numpy from the seed: the same weights on both frameworks
    if args.lora_target_modules:
        _apply_lora(model, args)
    return model


def _check_diffusers_config(path: str, config: Any) -> None:
    """The downloaded config.json must describe the model json's network (its text_len is MindSpeed-MM's own)."""
    from mmrun.models.wan.configuration import WanTransformerConfig

    theirs = WanTransformerConfig.from_diffusers(path).to_diffusers()
    ours = config.to_diffusers()
    differ = [f"{key} {theirs.get(key)!r} (--mm-model: {ours.get(key)!r})" for key in sorted(set(ours) | set(theirs))
              if not key.startswith("_") and theirs.get(key) != ours.get(key)]
    if differ:
        raise UsageError(f"--load {path}: its config.json is another network than --mm-model {_SPEC.path}: "
                         f"{'; '.join(differ[:4])}; pass the transformer directory of the model the json describes")


def _apply_lora(model: Any, args: argparse.Namespace) -> None:
    from mmrun.models import lora
    from mmrun.models.wan.mindspeed_names import LORA_TARGETS

    lora.apply_from_args(model, args, LORA_TARGETS, print_rank_0)


# ------------------------------------------------------------------------------------------------ data

class TrainingSamples:
    """The feature dataset in the run's sample order (EpochView), each sample with its place in that order, and
    the collate that turns a micro-batch into the model's inputs and the objective's target and weight."""

    worker_safe = False

    def __init__(self, view: Any, flow: Any, seed: int, task: str) -> None:
        self.view, self.flow, self.seed, self.task = view, flow, seed, task

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, index: int) -> tuple[int, dict[str, np.ndarray]]:
        return index, self.view[index]

    def collate(self, items: list[tuple[int, dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
        from mmrun.data.video import feature_files as ff

        positions = [position for position, _ in items]
        keys = (ff.VIDEO, ff.PROMPT_IDS, ff.PROMPT_MASK) + ((ff.I2V_CLIP, ff.I2V_VAE) if self.task == "i2v" else ())
        batch = ff.collate([sample for _, sample in items], keys)
        out = self.flow.training_batch(batch[ff.VIDEO], self.seed, positions)
        prompt = batch[ff.PROMPT_IDS].astype(np.float32)
        lengths = batch[ff.PROMPT_MASK].reshape(len(items), -1).sum(axis=1).astype(np.int64)
        prompt[np.arange(prompt.shape[1])[None, :] >= lengths[:, None]] = 0  # MindSpeed-MM's WanDiT: prompt[i, n:] = 0
        out["encoder_hidden_states"] = prompt
        if self.task == "i2v":  # the first frame's latents and mask join the noisy latents as channels
            out["hidden_states"] = np.concatenate([out["hidden_states"], batch[ff.I2V_VAE].astype(np.float32)], axis=1)
            out["encoder_hidden_states_image"] = batch[ff.I2V_CLIP].astype(np.float32)
        return out


def train_valid_test_datasets_provider(train_val_test_num_samples: tuple[int, int, int]) -> tuple[Any, None, None]:
    """feature_data.json's features, repeated over epochs in the seed's order (dataloader_param.shuffle)."""
    from mmrun.data.epochs import EpochView
    from mmrun.data.video.feature_files import FeatureDataset
    from mmrun.models.wan.flow_match import FlowMatchTraining

    args = get_args()
    if args.mm_tool:
        read_mm_json(args.mm_tool, "--mm-tool")
    data = read_mm_json(args.mm_data, "--mm-data")
    if not isinstance(data, dict) or not isinstance(data.get("dataset_param"), dict):
        raise UsageError(f"--mm-data {args.mm_data}: needs a dataset_param object (MindSpeed-MM's feature_data.json)")
    config = _SPEC.predictor
    dataset = FeatureDataset.from_dataset_param(data["dataset_param"], _SPEC.task, text_dim=config.text_dim,
                                                img_dim=config.image_dim, in_channels=config.in_channels)
    dataset[0]  # a feature file that does not fit the model stops here, before training starts
    loader = data.get("dataloader_param") or {}
    view = EpochView(dataset, train_val_test_num_samples[0], seed=args.seed, shuffle=bool(loader.get("shuffle", True)))
    print_rank_0(f" > {len(dataset)} feature files, {view.num_samples} samples to read "
                 f"({'shuffled' if view.shuffle else 'in file order'} each epoch, seed {args.seed})")
    return TrainingSamples(view, FlowMatchTraining(_SPEC.diffusion), args.seed, _SPEC.task), None, None


# ------------------------------------------------------------------------------------------------ step

def get_batch(data_iterator: Iterator) -> dict[str, Any]:
    """The next micro-batch as tensors on this process's device: the model's inputs in its compute dtype (the
    timestep, target and weight stay fp32: the loss is computed in fp32)."""
    from mmrun.backend import tensors

    args = get_args()
    compute = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    fp32 = ("timestep", "target", "loss_weight")
    return {key: tensors.from_numpy(value, dtype=None if key in fp32 else compute)
            for key, value in next(data_iterator).items()}


def loss_func(target: Any, weight: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
    """MindSpeed-MM's training_losses: mse(output.float(), (noise - x0).float()) * the timestep's weight."""
    loss = flow_match_loss(output_tensor, target, weight)
    return loss, {"lm loss": loss}


def forward_step(data_iterator: Iterator, model: Any) -> tuple[Any, Any]:
    batch = get_batch(data_iterator)
    output = model(batch["hidden_states"], batch["timestep"], batch["encoder_hidden_states"],
                   batch.get("encoder_hidden_states_image"))
    return output, partial(loss_func, batch["target"], batch["loss_weight"])


def main(argv: list[str] | None = None) -> Any:
    tokens = list(sys.argv[1:] if argv is None else argv)
    try:
        source = _model_source(tokens)
    except UsageError as err:
        say_rank0("error", str(err))
        raise SystemExit(2) from None
    if _SPEC.ignored:
        say_rank0("warning", f"{_SPEC.path}: {', '.join(_SPEC.ignored)} not read by training (features are extracted "
                        "beforehand)")
    return pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step,
                    args_defaults=CPU_DEFAULTS, extra_args_provider=extra_args_provider, argv=tokens,
                    model_source=source)


if __name__ == "__main__":
    main()
