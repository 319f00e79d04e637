"""MindSpeed-MM's real launch scripts run through mmrun, as a user runs them (issue 37 item 6): each script of
tests/fixtures/mindspeed_mm/ (Ascend/MindSpeed-MM at 57069cd5) whose model mmrun builds, its torchrun form on
PyTorch and its msrun twin on MindSpore, with only the user's edits (tests/training/real_scripts.py: the
launcher, the entry, the paths, 2 iterations, the job's sizes) on tiny random weights, its json/yaml copied and
shrunk (sizes only, every key kept).

A training job passes when it exits 0 after 2 iterations whose logged losses are finite; inference when it prints
text; evaluation when it prints its accuracy line. The gate's verdict on the NPU for the scripts as written is
tests/features/test_mindspeed_mm_scripts.py.

Three changes to the scripts' values come from this machine, not from a user's job, and are made here in the open:
- the world size: never more than 2 processes (CI has 2 cores); where the script's TP x PP exceeds 2 (the 72B
  scripts' TP2 x PP8, the Qwen3-VL 8B twin's PP4) the split is scaled down to 2 (TP2 x PP1, PP2), with the
  json's pipeline_num_layers shrunk to match; a script of TP=PP=1 runs on 1 process;
- no NPU: `--on-unsupported warn`, so the NPU kernels the scripts ask for (--use-flash-attn) fall back to the
  same math with a warning, and `--distributed-backend` stays as written (mmrun runs gloo on a CPU); MindSpore
  has no bf16 kernels on a CPU, so its twins drop --bf16 (fp32, the gate's hint) and the inference json's dtype
  is fp32.
- the compile: a MindSpore twin runs 2 iterations, which never pay back the compile (measured: the 7B twin 47.5 s
  compiled, 30.0 s in PyNative), so the twins run with `--no-ms-jit` except the 7B one and the 30B MoE (COMPILED), which keep
  MindSpore's default compiled step on the real model json; the compiled steps' equality with PyTorch is the
  parity tests' (tests/models/test_vlm_fixed_shapes.py, tests/training/test_pretrain_vlm.py).
The tiny tokenizer's vocabulary is rounded up to even so that TP2 divides it (the real 152064 is). Where a json
leaves a special token's id to Qwen's tokenizer (Qwen2.5-VL's video_token_id, Qwen3-VL's vision_end_token_id), the
tiny tokenizer's id is added (the only keys added); Qwen3-VL's rope_theta is the tiny transformers model's.

Status (issue 37 item 6, issue 39): all 25 run: the two Qwen2.5-VL LoRA msrun twins with LoRA split on MindSpore's
parallel engine, Omni's script and its msrun twin with their PP=2. The Qwen3-VL 30B MoE msrun twin runs here on
2 processes with its EP2 as written (TP2 x PP4 x EP2 scaled to TP1 x PP1 x EP2: the data-parallel engine, each rank
2 of the tiny model's 4 experts, --use-distributed-optimizer on); its FSDP2 form is tests/training/
test_qwen3_vl_moe_yaml.py's.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.models.test_evaluate_vlm import demo_image, write_tsv
from tests.training.real_scripts import FIXTURES, FRAMEWORKS, flag_value, launch_line, set_flags, shrink

ROOT = Path(__file__).resolve().parents[2]
ITERS = 2
# this machine (a CPU): what the launch line and the json change, per framework (see the docstring)
MACHINE_FLAGS = {"pytorch": {"--on-unsupported": "warn"}, "mindspore": {"--on-unsupported": "warn", "--bf16": None}}
MACHINE_JSON = {"pytorch": {}, "mindspore": {"dtype": "fp32"}}
# the twins that keep the compile (docstring); the 30B MoE's is also the faster one (measured: 39 s compiled at
# load 10, 65 s in PyNative on a quiet machine)
COMPILED = {"mindspore/qwen2.5vl/finetune_qwen2_5_vl_7b.sh", "mindspore/qwen3vl/finetune_qwen3vl_30B.sh"}
# Megatron's log line of one iteration: " iteration        2/       2 | ... | lm loss: 1.234567E+00 | ..."
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?\b(?:lm loss|loss): ([-+0-9.eEnaNinf]+)")


# ------------------------------------------------------------------------------------------ Qwen2.5-VL

# Sizes of the Qwen2.5-VL json files (model_7b/72b, inference, evaluate; both frameworks' copies): the tiny model
# tests/models/tiny_hf.py builds for qwen2_5_vl, with the demo tokenizer's ids (data.multimodal.demo).
QWEN25_VISION = {"num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "intermediate_size": 64,
                 "llm_hidden_size": 64, "num_attention_heads": 2, "fullatt_block_indexes": [1]}
QWEN25_PROJECTOR = {"input_size": 32, "hidden_size": 64, "ffn_hidden_size": 128}
QWEN25_TEXT = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
               "num_query_groups": 2, "mrope_section": [4, 2, 2], "max_position_embeddings": 1024}


def qwen25_shrunk(raw: dict, ids: dict[str, int], vit_layers: list[int], llm_layers: list[int],
                  **more: Any) -> dict:
    """A Qwen2.5-VL json shrunk to the tiny model. The one key added: the files leave video_token_id at Qwen's
    tokenizer's id (151656), the tiny tokenizer's differs (mmrun checks that model.json and tokenizer.json agree)."""
    out = shrink(raw, {**qwen25_sizes(ids["vocab_size"], ids, vit_layers, llm_layers), **more})
    out.setdefault("video_token_id", ids["video_token_id"])
    return out


def qwen25_sizes(vocab: int, ids: dict[str, int], vit_layers: list[int], llm_layers: list[int]) -> dict[str, Any]:
    sizes = {"img_context_token_id": ids["image_token_id"], "vision_start_token_id": ids["vision_start_token_id"],
             "image_encoder.vision_encoder.pipeline_num_layers": vit_layers,
             "text_decoder.pipeline_num_layers": llm_layers, "text_decoder.vocab_size": vocab}
    sizes.update({f"image_encoder.vision_encoder.{k}": v for k, v in QWEN25_VISION.items()})
    sizes.update({f"image_encoder.vision_projector.{k}": v for k, v in QWEN25_PROJECTOR.items()})
    sizes.update({f"text_decoder.{k}": v for k, v in QWEN25_TEXT.items()})
    return sizes


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    """The demo (data, tokenizer, processor) and a tiny random Qwen2.5-VL as a Hugging Face directory whose
    config is the shrunk model_7b.json (the weights --load reads)."""
    from mmrun.backend import tensors
    from mmrun.data.multimodal.demo import make_demo, special_token_ids_for_model_config
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.qwen2_vl.hf_checkpoint import save_hf_directory
    from mmrun.models.qwen2_vl.modeling import Qwen2VLForConditionalGeneration
    from mmrun.models.vlm.blocks import init_weights
    from mmrun.models.vlm.model_json import read_model_json

    root = tmp_path_factory.mktemp("qwen25")
    demo = make_demo(str(root / "demo"), num_samples=8, seed=7)
    ids = special_token_ids_for_model_config(demo["model_dir"])
    ids["vocab_size"] += ids["vocab_size"] % 2  # TP2 divides it
    model_json = root / "model.json"
    model_json.write_text(json.dumps(qwen25_shrunk(json.loads((FIXTURES / "qwen2.5vl/model_7b.json").read_text()),
                                                   ids, [2], [2])))
    config = Qwen2VLConfig.from_hf_config(read_model_json(model_json).hf_config)
    model = Qwen2VLForConditionalGeneration(config)
    init_weights(model, seed=3, std=0.3)
    save_hf_directory(root / "hf", config, tensors.state_dict_to_numpy(model.state_dict()),
                      copy_files_from=demo["model_dir"])
    # VLMEvalKit's AI2D_TEST.tsv (the evaluate json's dataset), five questions over the demo's pictures
    ai2d = write_tsv(root / "AI2D_TEST.tsv", ["index", "image", "question", "A", "B", "C", "answer", "category"],
                     [[i, demo_image(root, picture), "How many shapes?", "one", "two", "three", "ABCAB"[i], "count"]
                      for i, picture in enumerate((0, 1, 2, 4, 5))])
    return {"root": root, "demo": demo, "ids": ids, "hf": root / "hf", "ai2d": ai2d}


# ------------------------------------------------------------------------------------------ Wan2.1

# Sizes of Wan2.1's pretrain_model.json (t2v and i2v): a one-layer DiT over 4-channel latents of 2x4x4.
WAN_PREDICTOR = {"text_len": 8, "hidden_size": 16, "ffn_dim": 32, "freq_dim": 16, "text_dim": 12, "img_dim": 16,
                 "out_dim": 4, "num_heads": 2, "num_layers": 1, "pipeline_num_layers": [1], "max_seq_len": 64,
                 "clip_token_len": 5}
WAN_IN_DIM = {"t2v": 4, "i2v": 4 + 4 + 4}  # the latents' channels (+ the first frame's latents and frame mask)


def wan_model_json(task: str, script_dir: Path) -> dict:
    raw = json.loads((script_dir / "pretrain_model.json").read_text())
    return shrink(raw, {f"predictor.{k}": v for k, v in {**WAN_PREDICTOR, "in_dim": WAN_IN_DIM[task]}.items()})


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """Per task: four tiny random feature files (MindSpeed-MM's feature keys) with their data.jsonl index, and a
    tiny random DiT as a diffusers transformer/ directory (the --load of the scripts)."""
    import numpy as np

    from mmrun.data.video import feature_files as ff
    from mmrun.models.wan import transformer
    from mmrun.models.wan.model_json import read_sora_model_json

    root = tmp_path_factory.mktemp("wan")
    kit: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for task in ("t2v", "i2v"):
        folder = root / task
        (folder / "features").mkdir(parents=True)
        records = []
        for i in range(4):
            sample = {ff.VIDEO: rng.standard_normal((4, 2, 4, 4)).astype(np.float32),
                      ff.PROMPT_IDS: rng.standard_normal((8, 12)).astype(np.float32),
                      ff.PROMPT_MASK: (np.arange(8) < 3 + i).astype(np.int64)}
            if task == "i2v":
                sample[ff.I2V_CLIP] = rng.standard_normal((5, 16)).astype(np.float32)
                sample[ff.I2V_VAE] = rng.standard_normal((8, 2, 4, 4)).astype(np.float32)
            name = ff.feature_file_name(f"clip{i}.mp4")
            ff.write_feature_file(folder / "features" / name, sample)
            records.append({"path": f"clip{i}.mp4", "cap": f"caption {i}", "file": f"features/{name}"})
        ff.write_index(folder / "data.jsonl", records)
        model_json = write_json(folder / "pretrain_model.json",
                                wan_model_json(task, FIXTURES / "wan2.1" / "1.3b" / task))
        config = read_sora_model_json(str(model_json)).predictor
        model = transformer.WanTransformer3DModel(config)
        transformer.init_weights(model, 3)
        transformer.save_diffusers_directory(folder / "transformer", config, model.state_dict())
        kit[task] = folder
    return kit


def wan_extraction(demo: Path, job: Job, args: list[str], out: Path) -> list[str]:
    """feature_extraction.sh: data.json and model_t2v.json shrunk to scripts/wan/make_demo.py's two 5-frame 32x32
    clips and its tiny VAE / UMT5 / tokenizer; tools.json's save path into `out`."""
    source = FIXTURES / "wan2.1" / "feature_extract"
    tiny = demo / "Wan-tiny-Diffusers"
    prefix = "dataset_param.preprocess_parameters."
    data = shrink(json.loads((source / "data.json").read_text()),
                  {"dataset_param.basic_parameters.data_path": str(demo / "data.txt"), prefix + "num_frames": 5,
                   prefix + "max_height": 32, prefix + "max_width": 32, prefix + "max_hxw": 1024,
                   "dataset_param.tokenizer_config.from_pretrained": str(tiny / "tokenizer"),
                   "dataset_param.tokenizer_config.model_max_length": 16})
    model = shrink(json.loads((source / "model_t2v.json").read_text()),
                   {"ae.from_pretrained": str(tiny / "vae"), "text_encoder.from_pretrained": str(tiny / "text_encoder")})
    tools = json.loads((demo / "tools.json").read_text())
    tools["sorafeature"]["save_path"] = str(out / "sora_features")
    return set_flags(args, {"--mm-data": write_json(out / "data.json", data),
                            "--mm-model": write_json(out / "model_t2v.json", model),
                            "--mm-tool": write_json(out / "tools.json", tools), "--global-batch-size": 1})


@pytest.fixture(scope="module")
def wan_demo(tmp_path_factory) -> Path:
    """scripts/wan/make_demo.py's clips and tiny Wan Diffusers directory (2 clips, 5 frames of 32x32)."""
    import importlib.util

    root = tmp_path_factory.mktemp("wan_demo")
    spec = importlib.util.spec_from_file_location("mmrun_tests_wan_make_demo", ROOT / "scripts" / "wan" / "make_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.main([str(root), "--videos", "2", "--frames", "5", "--size", "32"])
    return root


def wan_job(kit: dict, job: Job, args: list[str], out: Path) -> list[str]:
    """Wan2.1 pre-train / LoRA: pretrain_model.json and feature_data.json copied and shrunk, paths into `out`."""
    source = FIXTURES / Path(job.script).parent
    task = source.name
    folder = kit[task]
    data = shrink(json.loads((source / "feature_data.json").read_text()),
                  {"dataset_param.basic_parameters.data_path": str(folder / "data.jsonl"),
                   "dataset_param.basic_parameters.data_folder": str(folder)})
    return set_flags(args, {"--mm-model": write_json(out / "pretrain_model.json", wan_model_json(task, source)),
                            "--mm-data": write_json(out / "feature_data.json", data),
                            "--mm-tool": ROOT / "scripts" / "wan" / "tools.json", "--load": folder / "transformer",
                            "--save": out / "save", "--global-batch-size": job.processes, "--train-iters": ITERS})


# ------------------------------------------------------------------------------------------ Qwen3-VL 8B

# Sizes of the Qwen3-VL 8B files: the model tests/training/qwen3_vl_job.py's tiny_hf_qwen3_vl saves (the single
# YAML's model section only checks them, as MindSpeed-MM's comments say; model_8B.json of the msrun twin builds
# from them)
QWEN3_VISION = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 64,
                "intermediate_size": 64, "llm_hidden_size": 32, "max_position_embeddings": 16,
                "deepstack_visual_indexes": [0, 1]}
QWEN3_TEXT = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 512,
              "ffn_hidden_size": 64, "kv_channels": 16, "num_query_groups": 2, "rope_theta": 10000.0,
              "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"}}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """The Qwen3-VL demo (data, tokenizer, 16-pixel patches) and tiny_hf_qwen3_vl's random transformers model."""
    from mmrun.data.multimodal.demo import make_demo, special_token_ids_for_model_config
    from tests.training.qwen3_vl_job import tiny_hf_qwen3_vl

    root = tmp_path_factory.mktemp("qwen3")
    demo = make_demo(str(root / "demo"), num_samples=8, seed=7, model="qwen3_vl")
    tiny_hf_qwen3_vl(demo["model_dir"])
    return {"demo": demo, "hf": Path(demo["model_dir"]), "ids": special_token_ids_for_model_config(demo["model_dir"])}


def qwen3_data(raw: dict, kit: dict, out: Path) -> dict:
    demo = kit["demo"]
    return shrink(raw, {"dataset_param.preprocess_parameters.model_name_or_path": demo["model_dir"],
                        "dataset_param.preprocess_parameters.image_max_pixels": 12544,
                        "dataset_param.basic_parameters.dataset_dir": str(Path(demo["dataset"]).parent),
                        "dataset_param.basic_parameters.dataset": demo["dataset"],
                        "dataset_param.basic_parameters.cache_dir": str(out / "cache_dir")})


def qwen3_job(kit: dict, job: Job, args: list[str], out: Path) -> list[str]:
    """finetune_qwen3vl_8B.sh: the single YAML (pretrain_transformers.py) copied and shrunk, its FSDP2 file as it
    is; the msrun twin: model_8B.json / data_8B.json shrunk, pretrain_vlm.py."""
    source = FIXTURES / Path(job.script).parent
    vocab = kit["ids"]["vocab_size"]
    if job.framework == "pytorch":
        raw = yaml.safe_load((source / "qwen3vl_full_sft_8B.yaml").read_text())
        gpt = {"train_iters": ITERS, "global_batch_size": job.processes, "vocab_size": vocab, "save": str(out / "save"),
               "load": str(out / "mm_path"), "fsdp2_config_path": str(source / "fsdp2_config.yaml")}
        job_yaml = shrink(raw, {**{f"gpt_args.{k}": v for k, v in gpt.items()},
                                **{f"data.{k}": v for k, v in _flat(qwen3_data(raw["data"], kit, out)).items()},
                                "model.init_from_hf_path": str(kit["hf"]),
                                **{f"model.image_encoder.vision_encoder.{k}": v for k, v in QWEN3_VISION.items()},
                                **{f"model.text_decoder.{k}": v for k, v in QWEN3_TEXT.items()},
                                **{k: str(out / k.lower()) for k in ("HF_MODEL_LOAD_PATH", "MM_MODEL_LOAD_PATH",
                                                                     "DATASET_PATH", "FSDP2_PATH", "SAVE_PATH")}})
        return [str(write_json(out / "qwen3vl_full_sft_8B.yaml", job_yaml)), *args[args.index("--distributed-backend"):]]
    ids = kit["ids"]
    model_name, data_name = (Path(_script_value(job, name)).name for name in ("MM_MODEL", "MM_DATA"))
    pp = int(job.split.get("--pipeline-model-parallel-size", 1))
    hf, moe = kit["hf"], {}
    if model_name == "model_30B.json":  # the MoE twin: tiny_hf_qwen3_vl(moe=True)'s experts, in its own directory
        import shutil
        from tests.training.qwen3_vl_job import tiny_hf_qwen3_vl

        hf = out / "hf_moe"
        shutil.copytree(kit["hf"], hf)
        vocab += vocab % 2  # TP2 divides it
        tiny_hf_qwen3_vl(str(hf), moe=True, vocab_size=vocab)
        moe = {"text_decoder.num_moe_experts": 4, "text_decoder.moe_router_topk": 2,
               "text_decoder.moe_intermediate_size": 16}
    model = shrink(json.loads((source / model_name).read_text()), {
        "img_context_token_id": ids["image_token_id"], "video_token_id": ids["video_token_id"],
        "vision_start_token_id": ids["vision_start_token_id"],
        **{f"image_encoder.vision_encoder.{k}": v for k, v in QWEN3_VISION.items()},
        "image_encoder.vision_encoder.pipeline_num_layers": [2] + [0] * (pp - 1),
        "image_encoder.vision_projector.input_size": 32, "image_encoder.vision_projector.hidden_size": 32,
        "image_encoder.vision_projector.ffn_hidden_size": 128,
        **{f"text_decoder.{k}": v for k, v in QWEN3_TEXT.items()}, "text_decoder.vocab_size": vocab,
        "text_decoder.pipeline_num_layers": [2 // pp] * pp, "text_decoder.recompute_num_layers": 1,
        "text_decoder.seq_length": 512, **moe})
    model.setdefault("vision_end_token_id", ids["vision_end_token_id"])  # as qwen25_shrunk's video_token_id
    data = qwen3_data(json.loads((source / data_name).read_text()), kit, out)
    return set_flags(args, {"--mm-model": write_json(out / model_name, model),
                            "--mm-data": write_json(out / data_name, data),
                            "--mm-tool": ROOT / "scripts" / "wan" / "tools.json", "--load": hf,
                            "--save": out / "save", "--vocab-size": vocab, "--global-batch-size": 1,
                            "--seq-length": 512,  # the tiny model's max_position_embeddings
                            "--train-iters": ITERS, **job.split})


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of a nested dict's leaves."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


# ------------------------------------------------------------------------------------------ Qwen2.5-Omni

# Sizes of the Omni model_7b.json (both frameworks' copies): those of scripts/qwen2_5omni/model_tiny.json (the same
# file shrunk: tests/training/test_pretrain_omni.py's thinker), split as the script's PP=2 (audio encoder and ViT on
# stage 0, the LLM's two layers one a stage)
OMNI_TINY = ROOT / "scripts" / "qwen2_5omni" / "model_tiny.json"


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """tests/training/omni_job.py's audio/image/video dataset and tokenizer, and a tiny random transformers
    Qwen2.5-Omni thinker saved as a Hugging Face directory (the script's LOAD_PATH) whose config is model_tiny.json."""
    pytest.importorskip("av")
    import torch
    import transformers

    from mmrun.models.qwen2_5_omni import model_json
    from tests.training.omni_job import make_job

    root = tmp_path_factory.mktemp("omni")
    paths = make_job(root / "files", samples=4)
    torch.manual_seed(0)
    config = transformers.Qwen2_5OmniThinkerConfig(
        **model_json.parse_model_json(json.loads(OMNI_TINY.read_text())).hf_config)
    transformers.Qwen2_5OmniThinkerForConditionalGeneration(config).save_pretrained(root / "hf")
    return {"paths": paths, "hf": root / "hf"}


def omni_job(kit: dict, job: Job, args: list[str], out: Path) -> list[str]:
    """finetune_qwen2_5_omni_7b.sh (and its msrun twin): model_7b.json shrunk to model_tiny.json's sizes, data_7b.json's
    paths into the kit's dataset; LOAD_PATH the tiny thinker's Hugging Face directory."""
    source = FIXTURES / Path(job.script).parent
    model = shrink(json.loads((source / "model_7b.json").read_text()), _flat(json.loads(OMNI_TINY.read_text())))
    paths = kit["paths"]
    data = shrink(json.loads((source / "data_7b.json").read_text()), _flat({"dataset_param": {
        "preprocess_parameters": {"model_name_or_path": str(paths["model_dir"])},
        "basic_parameters": {"dataset_dir": str(paths["dataset"].parent), "dataset": str(paths["dataset"]),
                             "cache_dir": str(out / "cache_dir")}}}))
    return set_flags(args, {"--mm-model": write_json(out / "model_7b.json", model),
                            "--mm-data": write_json(out / "data_7b.json", data),
                            "--mm-tool": ROOT / "scripts" / "wan" / "tools.json", "--load": kit["hf"],
                            "--save": out / "save_dir", "--global-batch-size": 1, "--train-iters": ITERS})


# ------------------------------------------------------------------------------------------ the jobs

@dataclass
class Job:
    """One real script and what the user changes to run it here."""
    script: str
    kind: str = "train"                       # train | generate | evaluate | extract
    processes: int = 1
    split: dict[str, int] = field(default_factory=dict)   # the scaled-down split (flag -> size), when scaled
    note: str = ""

    @property
    def framework(self) -> str:
        return "mindspore" if self.script.startswith("mindspore/") else "pytorch"


def write_json(path: Path, raw: Any) -> Path:
    path.write_text(json.dumps(raw, indent=1) if path.suffix == ".json" else yaml.safe_dump(raw, sort_keys=False))
    return path


def qwen25_job(kit: dict, job: Job, args: list[str], out: Path) -> list[str]:
    """The Qwen2.5-VL scripts: model/data/inference/evaluate json copied and shrunk, paths into `out`."""
    tp = int(job.split.get("--tensor-model-parallel-size", flag_value(args, "--tensor-model-parallel-size") or 1))
    pp = int(job.split.get("--pipeline-model-parallel-size", flag_value(args, "--pipeline-model-parallel-size") or 1))
    ids, vocab = kit["ids"], kit["ids"]["vocab_size"]
    source = FIXTURES / Path(job.script).parent
    name = Path(_script_value(job, "MM_MODEL")).name
    raw = json.loads((source / name).read_text())
    vit = [2] + [0] * (pp - 1)
    llm = [2 // pp] * pp
    if job.kind == "train":
        model = qwen25_shrunk(raw, ids, vit, llm)
    else:  # the inference/evaluation json: one process runs the whole model (its pipeline lists as they are)
        n = len(raw["text_decoder"]["pipeline_num_layers"])
        model = qwen25_shrunk(raw, ids, [2] + [0] * (n - 1), [1, 1] + [0] * (n - 2), **{
                             "min_pixels": 3136, "max_pixels": 12544,
                             "tokenizer.from_pretrained": str(kit["hf"]),
                             "generation_config.max_new_tokens": 8, "generation_config.bos_token_id": ids["bos_token_id"],
                             "generation_config.eos_token_id": [ids["eos_token_id"], ids["bos_token_id"]],
                             "generation_config.pad_token_id": ids["pad_token_id"],
                             "generation_config.vision_start_token_id": ids["vision_start_token_id"],
                             "generation_config.image_token_id": ids["image_token_id"],
                             "generation_config.video_token_id": ids["video_token_id"],
                             "image_path": str(Path(kit["demo"]["dataset"]).parent / "images" / "0000.png"),
                             "result_output_path": str(out / "evaluation_outputs"),
                             "dataset_path": str(kit.get("ai2d", "")), **MACHINE_JSON[job.framework]})
    edits: dict[str, Any] = {"--mm-model": write_json(out / name, model), "--load": kit["hf"],
                             "--vocab-size": vocab, **job.split}
    if job.kind == "train":
        data_name = Path(_script_value(job, "MM_DATA")).name
        data = json.loads((source / data_name).read_text())
        demo = kit["demo"]
        data = shrink(data, {"dataset_param.preprocess_parameters.model_name_or_path": demo["model_dir"],
                             "dataset_param.preprocess_parameters.image_max_pixels": 12544,
                             "dataset_param.basic_parameters.dataset_dir": str(Path(demo["dataset"]).parent),
                             "dataset_param.basic_parameters.dataset": demo["dataset"],
                             "dataset_param.basic_parameters.cache_dir": str(out / "cache_dir")})
        edits.update({"--mm-data": write_json(out / data_name, data),
                      "--mm-tool": ROOT / "scripts" / "wan" / "tools.json", "--save": out / "save_dir",
                      "--global-batch-size": 2 // (tp * pp) or 1, "--train-iters": ITERS})
        if (fsdp := flag_value(args, "--fsdp2-config-path")):
            edits["--fsdp2-config-path"] = write_json(out / "fsdp2_config.yaml",
                                                      yaml.safe_load((source / Path(fsdp).name).read_text()))
    else:
        edits["--global-batch-size"] = 1
    return set_flags(args, edits)


def _script_value(job: Job, variable: str) -> str:
    match = re.search(rf'^{variable}="?([^"\n]+)"?', (FIXTURES / job.script).read_text(), re.M)
    return match.group(1)


KITS: dict[str, tuple[str, Callable]] = {"qwen2.5vl": ("qwen25", qwen25_job), "wan2.1": ("wan", wan_job),
                                         "feature_extract": ("wan_demo", wan_extraction), "qwen3vl": ("qwen3", qwen3_job),
                                         "qwen2.5omni": ("omni", omni_job)}

TP2 = {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 1}
JOBS = [
    Job("qwen2.5vl/finetune_qwen2_5_vl_7b.sh", processes=2),                      # TP1 x PP2 as written
    Job("qwen2.5vl/finetune_qwen2_5_vl_72b.sh", processes=2, split=TP2, note="TP2 x PP8 scaled to TP2 x PP1"),
    Job("qwen2.5vl/finetune_qwen2_5_vl_72b_fsdp.sh", processes=1),
    Job("qwen2.5vl/inference_qwen2_5_vl_7b.sh", kind="generate"),
    Job("qwen2.5vl/inference_qwen2_5_vl_72b.sh", kind="generate"),
    Job("qwen2.5vl/evaluate_qwen2_5_vl_7b.sh", kind="evaluate"),
    Job("qwen2.5vl/evaluate_qwen2_5_vl_72b.sh", kind="evaluate"),
    Job("mindspore/qwen2.5vl/finetune_qwen2_5_vl_7b.sh", processes=2),
    Job("mindspore/qwen2.5vl/finetune_qwen2_5_vl_72b.sh", processes=2, split=TP2, note="TP2 x PP8 scaled to TP2 x PP1"),
    Job("mindspore/qwen2.5vl/finetune_qwen2_5_vl_7b_lora.sh", processes=2),
    Job("mindspore/qwen2.5vl/finetune_qwen2_5_vl_72b_lora.sh", processes=2, split=TP2,
        note="TP2 x PP8 scaled to TP2 x PP1"),
    Job("mindspore/qwen2.5vl/inference_qwen2_5_vl_7b.sh", kind="generate"),
    Job("mindspore/qwen2.5vl/evaluate_qwen2_5_vl_7b.sh", kind="evaluate"),
    Job("wan2.1/1.3b/t2v/pretrain.sh"),
    Job("wan2.1/1.3b/i2v/pretrain.sh"),
    Job("wan2.1/1.3b/t2v/finetune_lora.sh"),
    Job("wan2.1/feature_extract/feature_extraction.sh", kind="extract"),
    Job("qwen3vl/finetune_qwen3vl_8B.sh"),
    Job("mindspore/qwen3vl/finetune_qwen3vl_8B.sh", processes=2, split={"--pipeline-model-parallel-size": 2},
        note="PP4 scaled to PP2"),
    # EP shares the experts out over data-parallel ranks (megatron-core): EP2 as written on 2 processes is TP1 x PP1
    # (the data-parallel engine, one sample per rank), with its --use-distributed-optimizer on; TP2 x EP2 on MindSpore's
    # parallel engine, with it too, is tests/training/test_qwen3_vl_moe_pretrain.py's (4 processes)
    Job("mindspore/qwen3vl/finetune_qwen3vl_30B.sh", processes=2,
        split={"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1,
               "--expert-model-parallel-size": 2, "--global-batch-size": 2}, note="TP2 x PP4 x EP2 scaled to EP2"),
    Job("mindspore/wan2.1/1.3b/t2v/pretrain.sh"),
    Job("mindspore/wan2.1/1.3b/i2v/pretrain.sh"),
    Job("mindspore/wan2.1/1.3b/t2v/finetune_lora.sh"),
    Job("qwen2.5omni/finetune_qwen2_5_omni_7b.sh", processes=2),                 # TP1 x PP2 as written
    Job("mindspore/qwen2.5omni/finetune_qwen2_5_omni_7b.sh", processes=2),
]
# Where a real script still stops under mmrun, and why (each one line at startup, exit 2).
XFAIL: dict[str, str] = {}  # none: the Qwen2.5-VL LoRA msrun twins train split (engines/mindspore/parallel/vlm_lora.py)


def _param(job: Job):
    # one xdist group per family and framework: its module fixture (tiny model, data: seconds) is built once on each
    # worker that runs one, and the family's two halves (minutes each) can run side by side; named like the
    # shared-fixture groups (tests/conftest.py) so that these long groups are handed out first
    marks = [pytest.mark.slow,
             pytest.mark.xdist_group(f"fixture:real_scripts_{KITS[_family(job)][0]}_{job.framework}")]
    if job.script in XFAIL:
        marks.append(pytest.mark.xfail(strict=False, reason=XFAIL[job.script]))
    return pytest.param(job, marks=marks, id=job.script)


def loaded_line(job: Job) -> str | None:
    """What the entry prints when it reads the weights the script's --load (or the YAML's init_from_hf_path) names:
    the fixtures' tiny random weights, not the entry's own random init (the extraction's VAE is the json's)."""
    if _family(job) == "wan2.1":
        return "loaded diffusers weights from"
    if job.kind in ("generate", "evaluate"):
        return "notice: weights: Hugging Face directory"
    if job.script == "qwen3vl/finetune_qwen3vl_8B.sh":
        return "start from the Hugging Face weights of init_from_hf_path"
    return None if job.kind == "extract" else " > loaded Hugging Face weights from"


def _family(job: Job) -> str:
    parts = Path(job.script.removeprefix("mindspore/")).parts
    return parts[1] if parts[1] == "feature_extract" else parts[0]


def losses_of(output: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(3)) for m in ITERATION.finditer(output)}


@pytest.mark.parametrize("job", [_param(job) for job in JOBS])
def test_the_real_script_runs_through_mmrun(job: Job, request, tk, tmp_path):
    launcher, entry, args = launch_line(FIXTURES / job.script)
    fixture, edit = KITS[_family(job)]
    args = edit(request.getfixturevalue(fixture), job, args, tmp_path)
    args = set_flags(args, MACHINE_FLAGS[job.framework])
    if job.framework == "mindspore" and job.kind == "train" and job.script not in COMPILED:
        args = set_flags(args, {"--no-ms-jit": True})
    run = tk.run_training(tmp_path / "run", args, framework=FRAMEWORKS[launcher], nproc=job.processes,
                          timeout=300, entry=ROOT / "models" / entry)
    assert run.returncode == 0, "\n".join([l for l in run.output.splitlines() if l.startswith(("error", "warning"))] + [run.output[-3000:]])
    if loaded_line(job):  # --load's tiny weights were read, not a fresh init
        assert loaded_line(job) in run.output, run.output[-3000:]
    if job.split.get("--expert-model-parallel-size", 1) > 1:  # the 30B twin's distributed optimizer, really on
        assert "(the experts' over their 1 expert-data-parallel rank(s)" in run.output, run.output[-3000:]
    if job.kind == "train":
        losses = losses_of(run.output)
        assert sorted(losses) == list(range(1, ITERS + 1)), run.output[-3000:]
        assert all(math.isfinite(v) for v in losses.values()), losses
    elif job.kind == "extract":  # the two clips' features and their index
        assert len((tmp_path / "sora_features" / "data.jsonl").read_text().splitlines()) == 2, run.output[-3000:]
    elif job.kind == "generate":  # the answer on stdout (the entry's notices and summary go to stderr)
        assert "new tokens after a prompt of" in run.output, run.output[-3000:]
        assert [line for line in run.stdout.splitlines() if line.strip() and not line.startswith(("*", "Setting"))], \
            run.output[-3000:]
    else:
        assert re.search(r"^> \w+: accuracy [0-9.]+ over \d+ questions", run.output, re.M), run.output[-3000:]
