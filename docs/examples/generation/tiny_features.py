"""Tiny random Wan2.1 training files in MindSpeed-MM's layout, for trying pretrain_sora.py without extracting
features: `python tiny_features.py OUT [--layers N]` writes

    OUT/features/clip{0..3}_mp4.{safetensors,pt}   two as mmrun writes them, two as MindSpeed-MM's torch.save does
    OUT/data.jsonl                                 the index ({"path", "cap", "file"} per line)
    OUT/feature_data.json                          dataset_type feature, pointing at the index
    OUT/pretrain_model.json                        MindSpeed-MM's keys: a t2v wandit of hidden size 16

(the .pt files need torch; `--no-pt` writes safetensors only). Real features come from get_wan_feature.py.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PREDICTOR = {"model_id": "wandit", "dtype": "bf16", "model_type": "t2v", "patch_size": [1, 2, 2], "text_len": 8,
             "in_dim": 4, "hidden_size": 16, "ffn_dim": 32, "freq_dim": 16, "text_dim": 12, "img_dim": 1280,
             "out_dim": 4, "num_heads": 2, "num_layers": 1, "pipeline_num_layers": [1], "qk_norm": True,
             "qk_norm_type": "rmsnorm", "cross_attn_norm": True, "eps": 1e-6, "max_seq_len": 64,
             "use_fused_rmsnorm": True}
DIFFUSION = {"model_id": "wan_flow_match_scheduler", "num_train_timesteps": 1000, "shift": 5, "sigma_min": 0.0,
             "extra_one_step": True}


def write_files(root: Path, layers: int = 1, pt: bool = True) -> dict[str, Path]:
    from mmrun.data.video import feature_files as ff

    (root / "features").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for i in range(4):
        sample = {ff.VIDEO: rng.standard_normal((4, 2, 4, 4)).astype(np.float32),
                  ff.PROMPT_IDS: rng.standard_normal((8, 12)).astype(np.float32),
                  ff.PROMPT_MASK: (np.arange(8) < 3 + i).astype(np.int64)}
        as_pt = pt and i % 2 == 1
        name = ff.feature_file_name(f"clip{i}.mp4", ff.PT_SUFFIX if as_pt else ff.SAFETENSORS_SUFFIX)
        if as_pt:
            import torch

            torch.save({key: torch.from_numpy(value) for key, value in sample.items()}, root / "features" / name)
        else:
            ff.write_feature_file(root / "features" / name, sample)
        records.append({"path": f"clip{i}.mp4", "cap": f"caption {i}", "file": f"features/{name}"})
    ff.write_index(root / "data.jsonl", records)
    data = {"dataset_param": {"dataset_type": "feature",
                              "basic_parameters": {"data_path": str(root / "data.jsonl"), "data_folder": str(root)}},
            "dataloader_param": {"dataloader_mode": "sampler", "shuffle": True, "drop_last": True}}
    model = {"load_video_features": True, "load_text_features": True, "task": "t2v", "diffusion": DIFFUSION,
             "predictor": {**PREDICTOR, "num_layers": layers, "pipeline_num_layers": [layers]}}
    (root / "feature_data.json").write_text(json.dumps(data, indent=1) + "\n")
    (root / "pretrain_model.json").write_text(json.dumps(model, indent=1) + "\n")
    return {"data": root / "feature_data.json", "model": root / "pretrain_model.json"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--no-pt", action="store_true", help="safetensors only (no torch needed)")
    options = parser.parse_args()
    files = write_files(Path(options.out), options.layers, pt=not options.no_pt)
    print(f"wrote {files['data']} and {files['model']}")
