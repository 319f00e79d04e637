"""The mindspore-parallel engine's vision-language side: which stage builds each Qwen vision-language family
(STAGES), this rank's stage and train step for model.json's model (build_step), and the engine the trainer drives
for models/pretrain_vlm.py (MindSporeVLMEngine). The stages themselves are vlm.py's (Qwen2-VL / Qwen2.5-VL) and
qwen3_vlm.py's (Qwen3-VL, built on vlm.py's layers); this module sits above both, so neither imports the other's
user.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.engines.mindspore.parallel import omni_vlm, qwen3_moe, qwen3_vlm, vlm
from mmrun.engines.mindspore.parallel.engine import MindSporeParallelEngine
from mmrun.engines.mindspore.parallel.optimizer import optimizer_and_step

# family (models/families.py) -> its stage class on the parallel layers
STAGES: dict[str, Any] = {"qwen2_vl": vlm.Qwen2VLStage, "qwen3_vl": qwen3_vlm.Qwen3VLStage,
                          "qwen2_5_omni": omni_vlm.OmniStage}
# ... on batches padded to fixed shapes (compiled; vlm.compiles says when), from the model's config
FIXED_STAGES: dict[str, Any] = {"qwen2_vl": vlm.fixed_stage, "qwen3_vl": lambda config: qwen3_vlm.Qwen3VLFixedShapeStage}


def build_step(args: Any, state: ParallelState, spec: Any, log: Callable[[str], None] = print) -> ParallelTrainStep:
    """This rank's stage of model.json's model (`spec`: models/vlm/model_json.ModelJson), starting from the
    one-process run's initial weights (mm_layout.initial_state for --seed, --init-method-std) or from --load's
    Hugging Face directory, frozen as model.json says, with its AdamW (Megatron's no-decay rule) and its
    ParallelTrainStep: compiled on fixed-shape batches where `compiles`, else PyNative."""
    from mmrun.models import families
    from mmrun.models.vlm import mm_layout

    family = families.by_model_type(spec.hf_config["model_type"])
    config = families.config_class(family).from_hf_config(spec.hf_config)
    hf_checkpoint = families.part(family, "hf_checkpoint")
    vlm.refuse_virtual_stages(spec)
    layout = vlm.VLMLayout.build(config, tp=state.tensor_model_parallel_size,
                             pp=state.pipeline_model_parallel_size, vit_pp_layers=spec.pipeline_layers.get("vit"),
                             llm_pp_layers=spec.pipeline_layers.get("llm"))
    fixed = vlm.compiles(args, spec)
    moe = {} if getattr(config.text, "moe", None) is None else {"experts": qwen3_moe.ExpertParallel.build(
        getattr(args, "expert_model_parallel_size", None) or 1, state)}  # Qwen3-VL MoE: experts over TP x EP
    model = (FIXED_STAGES[family.name](config) if fixed else STAGES[family.name])(
        config, layout, state, **moe)
    own = (lambda whole: qwen3_moe.own_experts(model, whole)) if moe else (lambda whole: whole)
    if args.load and hf_checkpoint.is_hf_directory(args.load):
        weights = hf_checkpoint.open_for_model(args.load, config, str(spec.path))
        model.load_rank_state_dict(own(mm_layout.rank_state_from_hf(layout, weights.read_float, state.tp_rank,
                                                                    state.pp_rank)))
        log(f" > loaded Hugging Face weights from {args.load}, this rank's shard; training starts at iteration 0")
        args.load = None  # nothing of the loop's own checkpoint layout to resume from
    else:
        model.load_rank_state_dict(own(mm_layout.initial_state(layout, args.seed, state.tp_rank, state.pp_rank,
                                                               std=args.init_method_std)))
    if getattr(args, "lora_target_modules", None):  # adapters on this stage's layers, the rest frozen
        from mmrun.engines.mindspore.parallel import vlm_lora

        vlm_lora.apply(model, layout, state, args, log)
    else:
        frozen = model.freeze(spec.freeze)
        log(f" > frozen (no gradients, no optimizer state): {', '.join(frozen) or 'nothing'}")
    per_token = bool(getattr(args, "calculate_per_token_loss", False))
    return optimizer_and_step(args, model, state, clip_grad=args.clip_grad, jit=fixed,
                              fields=getattr(model, "fields", vlm.VLM_FIXED_FIELDS if fixed else vlm.VLM_FIELDS),
                              hidden_size=getattr(model, "message_size", config.text.hidden_size),
                              loss_func=vlm.token_sum if per_token else None)



# ------------------------------------------------------------------------------------------ the trainer's engine

class MindSporeVLMEngine(MindSporeParallelEngine):
    """The mindspore-parallel engine training this VLM (instead of the GPT) for models/pretrain_vlm.py: the model
    from --mm-model's model.json, the micro-batches from the multimodal loader, checkpoints with MindSpeed-MM's
    names per (TP, PP) rank. Everything else (parallel state, refusals, checkpoint shards) is the GPT engine's."""

    model_names = "mindspeed-mm"

    def build(self, model_provider: Callable[..., Any], scheduler: Any) -> None:
        from mmrun.models.vlm.model_json import read_model_json

        args = self.args
        spec = read_model_json(args.mm_model)
        self.log(f"building {spec.hf_config['model_type']} model from {spec.path} for (tp, pp) rank "
                 f"({self.state.tp_rank}, {self.state.pp_rank}): MindSpeed-MM's names and shards "
                 "(engines/mindspore/parallel/vlm.py; the entry's model_provider is not called) ...")
        self.step = build_step(args, self.state, spec, self.log)
        experts = getattr(self.step.model, "experts", None)  # Qwen3-VL MoE
        if experts is not None:
            moe = self.step.model.config.text.moe
            self.log(f" > Qwen3-VL MoE on this stage: {moe.num_experts // experts.ep} of "
                     f"{moe.num_experts} experts per sparse layer (EP rank {experts.ep_rank} of {experts.ep}), each "
                     f"split over TP {self.state.tensor_model_parallel_size} (megatron-core's default expert-tensor-"
                     f"parallel size = TP); tokens dispatched over {experts.dispatch.size} rank(s) as Megatron's "
                     "allgather dispatcher")
            if experts.ep > 1:
                self.layout = qwen3_moe.ExpertLayout.of(self.layout, experts.ep)
            sharded = getattr(self.step.optimizer, "experts", None)  # zero.ExpertShardedAdamW
            if sharded is not None:
                from mmrun.backend.mindspore.parallel.zero import state_bytes

                self.log(f" > distributed optimizer: the experts' AdamW state sharded over {sharded.layout.dp} "
                         f"expert-data-parallel rank(s), the rest over {self.step.optimizer.dense.layout.dp} data-"
                         f"parallel rank(s): {state_bytes(sharded)} bytes of expert state and "
                         f"{state_bytes(self.step.optimizer.dense)} of the rest on this rank")
        self.scheduler = scheduler
        self.step.lr_scheduler, self.step.increment = scheduler, args.global_batch_size
        self.step.announce = self.log
        self.log("> MindSpore parallel train step: " + (
            "mindspore.jit (graph), on batches padded to fixed shapes" if self.step.jit
            else "PyNative (the inputs change shape with the images)"))

    def _micro_batches(self, data_iterator: Iterator) -> list[tuple[Any, ...]]:
        return vlm.read_micro_batches(data_iterator, self.args.num_micro_batches, self.state,
                                  bool(getattr(self.args, "calculate_per_token_loss", False)), self.step.fields)
