"""An offline multimodal demo: synthetic pictures with captions a tiny model can learn, in MindSpeed-MM's layout.

    out_dir/data.json                   MindSpeed-MM's data.json (dataset_param + dataloader_param), absolute paths
    out_dir/data/demo.json              mllm_format samples: {"messages": [...], "images": ["images/0000.png"]}
    out_dir/data/images/NNNN.png        56..112 px pictures: 1-3 shapes of one kind and colour on a plain background
    out_dir/model/tokenizer.json        byte-level BPE trained on the demo's text, with Qwen2-VL's special tokens
    out_dir/model/preprocessor_config.json   the Qwen2-VL image processor with small pixel limits (<= 16 tokens)

The caption names the count, colour and shape ("two red circles."), so the loss can only fall by looking at
the picture. A few samples are text only. The model's config.json is not written here; its token ids come
from `special_token_ids_for_model_config`. Everything is a function of `seed`: the same files every time.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any

from PIL import Image, ImageDraw

from mmrun.common.atomic_write import atomic_write
from mmrun.data.multimodal.image_processing import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from mmrun.data.multimodal.templates import QWEN2VL, TEMPLATES

# Qwen2-VL's added tokens, in the order of their ids there (151643...); here they get ids 0...
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
COUNTS = ("one", "two", "three")
BACKGROUNDS = ((245, 245, 245), (200, 200, 200), (30, 30, 30))
QUESTIONS = ("<image>What is in the picture?", "<image>Describe the image.", "What do you see?<image>")
TEXT_ONLY = (("What colour is a ripe tomato?", "red."), ("How many sides does a square have?", "four."),
             ("What shape is a wheel?", "a circle."), ("What colour is the sky on a clear day?", "blue."))
MIN_SIDE, MAX_SIDE = 56, 112
TEXT_ONLY_EVERY = 8  # one sample in eight has no image
VOCAB_SIZE = 600
# --model: what differs between the demo's model families (the template, the processor's patch and normalisation;
# Qwen3-VL's processor normalises with 0.5 / 0.5, transformers' IMAGENET_STANDARD_MEAN / _STD).
DEMO_MODELS = {
    "qwen2_vl": {"template": "qwen2vl", "patch_size": 14, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD},
    "qwen3_vl": {"template": "qwen3_vl", "patch_size": 16, "image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)},
}
PIXELS = {"min_pixels": 56 * 56, "max_pixels": 112 * 112}  # at most 8x8 patches = 16 image tokens


def caption(count: int, colour: str, shape: str) -> str:
    return f"{COUNTS[count - 1]} {colour} {shape}{'s' if count > 1 else ''}."


def draw_picture(rng: random.Random) -> tuple[Image.Image, str]:
    """A picture and its caption."""
    width, height = rng.randint(MIN_SIDE, MAX_SIDE), rng.randint(MIN_SIDE, MAX_SIDE)
    count, colour, shape = rng.randint(1, 3), rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    image = Image.new("RGB", (width, height), rng.choice(BACKGROUNDS))
    draw = ImageDraw.Draw(image)
    cell = width // count  # one shape per vertical strip, so shapes never overlap
    size = max(8, min(cell, height) * 2 // 3)
    for i in range(count):
        x = i * cell + rng.randint(0, max(0, cell - size))
        y = rng.randint(0, height - size)
        box = (x, y, x + size - 1, y + size - 1)
        fill = COLOURS[colour]
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x + size // 2, y), (x, y + size - 1), (x + size - 1, y + size - 1)], fill=fill)
    return image, caption(count, colour, shape)


def _png_bytes(image: Image.Image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def build_tokenizer_json(texts: list[str]) -> str:
    """A byte-level BPE tokenizer.json trained on `texts`, the Qwen special tokens first (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(QWEN_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str(pretty=True)


def special_token_ids_for_model_config(model_dir: str) -> dict[str, int]:
    """The ids a Qwen2-VL config.json needs for this tokenizer.json (image/video/vision tokens, eos, pad, vocab)."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        data = json.load(f)
    ids = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    vocab_size = max([*data["model"]["vocab"].values(), *ids.values()]) + 1
    return {"image_token_id": ids[QWEN2VL.image_pad], "video_token_id": ids[QWEN2VL.video_pad],
            "vision_start_token_id": ids[QWEN2VL.vision_start], "vision_end_token_id": ids[QWEN2VL.vision_end],
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids[QWEN2VL.end_of_turn],
            "pad_token_id": ids[QWEN2VL.pad], "vocab_size": vocab_size}


def data_json(dataset_file: str, dataset_dir: str, model_dir: str, template: str = QWEN2VL.name) -> dict[str, Any]:
    """MindSpeed-MM's data.json for the demo (examples/qwen2vl/data_*.json's keys)."""
    return {
        "dataset_param": {
            "dataset_type": "huggingface",
            "preprocess_parameters": {
                "model_name_or_path": model_dir,
                "image_max_pixels": PIXELS["max_pixels"],
                "image_min_pixels": PIXELS["min_pixels"],
            },
            "basic_parameters": {
                "template": template,
                "dataset_dir": dataset_dir,
                "dataset": dataset_file,
                "cache_dir": None,
                "train_on_prompt": False,
                "mask_history": False,
                "max_samples": None,
            },
            "attr": {
                "images": "images", "videos": None, "messages": "messages", "role_tag": "role",
                "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                "observation_tag": None, "function_tag": None, "system_tag": None,
            },
        },
        "dataloader_param": {
            "dataloader_mode": "sampler", "drop_last": True, "shuffle": False, "pin_memory": False,
            "collate_param": {"model_name": "qwen2vl", "ignore_pad_token_for_loss": True},
        },
    }


def make_demo(out_dir: str, num_samples: int = 64, seed: int = 1234, model: str = "qwen2_vl") -> dict[str, str]:
    """Write the demo (see the module docstring) for `model` (a DEMO_MODELS family: its template and image
    processor); returns the paths: data_json, dataset, model_dir."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1. Received: {num_samples}")
    family = DEMO_MODELS[model]
    template = TEMPLATES[family["template"]]
    rng = random.Random(seed)
    out_dir = os.path.abspath(out_dir)
    data_dir, model_dir = os.path.join(out_dir, "data"), os.path.join(out_dir, "model")
    os.makedirs(os.path.join(data_dir, "images"), exist_ok=True)
    os.makedirs(model_dir, exist_ok=True)
    samples = []
    for index in range(num_samples):
        if index % TEXT_ONLY_EVERY == TEXT_ONLY_EVERY - 1:
            question, answer = rng.choice(TEXT_ONLY)
            samples.append({"messages": [{"role": "user", "content": question},
                                         {"role": "assistant", "content": answer}], "images": []})
            continue
        image, text = draw_picture(rng)
        name = f"images/{index:04d}.png"
        atomic_write(os.path.join(data_dir, name), _png_bytes(image))
        samples.append({"messages": [{"role": "user", "content": rng.choice(QUESTIONS)},
                                     {"role": "assistant", "content": text}], "images": [name]})
    dataset_file = os.path.join(data_dir, "demo.json")
    atomic_write(dataset_file, json.dumps(samples, indent=1) + "\n")
    # every text the template can produce, so that no demo word is split into single bytes
    texts = [m["content"] for s in samples for m in s["messages"]]
    texts += [caption(c, col, shp) for c in (1, 2, 3) for col in COLOURS for shp in SHAPES]
    texts += [q for q in QUESTIONS] + [q + " " + a for q, a in TEXT_ONLY]
    texts += [QWEN2VL.system_slot.format(content=QWEN2VL.default_system) + slot for slot in QWEN2VL.slots.values()]
    if template is not QWEN2VL:  # (Qwen2-VL's demo tokenizer stays as it was)
        texts += [slot + template.empty_thought for slot in template.slots.values()]
    atomic_write(os.path.join(model_dir, "tokenizer.json"), build_tokenizer_json(texts * 4) + "\n")
    preprocessor = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
                    **PIXELS, "patch_size": family["patch_size"], "temporal_patch_size": 2, "merge_size": 2,
                    "image_mean": list(family["image_mean"]), "image_std": list(family["image_std"]),
                    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}
    atomic_write(os.path.join(model_dir, "preprocessor_config.json"), json.dumps(preprocessor, indent=2) + "\n")
    data_json_path = os.path.join(out_dir, "data.json")
    atomic_write(data_json_path, json.dumps(data_json(dataset_file, data_dir, model_dir, template.name), indent=2)
                 + "\n")
    return {"data_json": data_json_path, "dataset": dataset_file, "model_dir": model_dir}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmrun.data.multimodal.demo",
                                     description="Write the offline multimodal demo (data, tokenizer, data.json).")
    parser.add_argument("out_dir", help="directory to write into (created)")
    parser.add_argument("--num-samples", "--num_samples", type=int, default=64, help="samples (64)")
    parser.add_argument("--seed", type=int, default=1234, help="random seed (1234)")
    parser.add_argument("--model", choices=sorted(DEMO_MODELS), default="qwen2_vl",
                        help="the model family the data is for: its chat template and image processor (qwen2_vl)")
    args = parser.parse_args(argv)
    paths = make_demo(args.out_dir, args.num_samples, args.seed, args.model)
    print(f"demo written: {paths['data_json']} ({args.num_samples} samples in {paths['dataset']}, tokenizer and "
          f"image processor in {paths['model_dir']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
