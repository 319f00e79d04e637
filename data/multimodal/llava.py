"""LLaVA-Instruct JSON -> MindSpeed-MM's mllm_format (`llava_instruct_2_mllm_demo_format.py`).

    [{"id", "image", "conversations": [{"from": "human" | "gpt", "value"}]}]
 -> [{"images": ["<image_prefix>/<image>"], "messages": [{"role": "user" | "assistant", "content"}]}]

A sample without an image gets `"images": []`. With `image_root` (MindSpeed-MM's --coco_path), samples
whose image is not at `image_root/<image_prefix>/<image>` are skipped and counted, as MindSpeed-MM does.
An unknown speaker is an error naming the sample. The output is written through mmrun's atomic writer and
is never written over an existing file unless `overwrite`.

    mmrun llava-to-mllm data/llava_instruct_150k.json data/mllm_format_llava_instruct_data.json --image-root data/COCO2017
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from mmrun.common.atomic_write import atomic_write
from mmrun.data.gpt_dataset import DatasetConfigError

SPEAKERS = {"human": "user", "gpt": "assistant"}
PROG = "mmrun llava-to-mllm"
EPILOG = """examples:
  # the guides' step: LLaVA-Instruct-150K + COCO2017 -> data/mllm_format_llava_instruct_data.json
  mmrun llava-to-mllm data/llava_instruct_150k.json data/mllm_format_llava_instruct_data.json \\
      --image-root data/COCO2017

exit status: 0 written, 1 bad input (one line names the sample), 2 usage error.
"""


def convert_record(item: object, image_prefix: str, where: str) -> dict:
    """One LLaVA sample in mllm_format."""
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        raise DatasetConfigError(f"{where}: expected an object with a 'conversations' list. Received: {item!r:.80}.")
    messages = []
    for turn, message in enumerate(item["conversations"]):
        speaker = message.get("from") if isinstance(message, dict) else None
        if speaker not in SPEAKERS or not isinstance(message.get("value"), str):
            raise DatasetConfigError(f"{where}: conversation turn {turn} has speaker {speaker!r}; expected "
                                     f"{' or '.join(SPEAKERS)} with a string 'value'.")
        messages.append({"role": SPEAKERS[speaker], "content": message["value"]})
    images = [os.path.join(image_prefix, item["image"])] if item.get("image") else []
    return {"images": images, "messages": messages}


def convert_llava(input_path: str, output_path: str, image_prefix: str = "./train2017",
                  image_root: str | None = None, overwrite: bool = False) -> dict[str, int]:
    """Convert `input_path` into `output_path`; returns {"converted": n, "skipped": m} (see the module docstring)."""
    if os.path.exists(output_path) and not overwrite:
        raise DatasetConfigError(f"{output_path} already exists; remove it, choose another output, or pass --overwrite.")
    try:
        with open(input_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise DatasetConfigError(f"{input_path}: cannot read it as JSON ({exc}).") from None
    if not isinstance(data, list):
        raise DatasetConfigError(f"{input_path}: expected a JSON list of LLaVA samples. Received: {type(data).__name__}.")
    converted, skipped = [], 0
    for index, item in enumerate(data):
        where = f"{input_path}: sample {index}" + (f" (id {item.get('id')!r})" if isinstance(item, dict) else "")
        record = convert_record(item, image_prefix, where)
        if image_root is not None and record["images"] and not os.path.isfile(
                os.path.join(image_root, record["images"][0])):
            skipped += 1
            continue
        converted.append(record)
    atomic_write(output_path, json.dumps(converted, ensure_ascii=False))
    return {"converted": len(converted), "skipped": skipped}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Convert LLaVA-Instruct JSON into MindSpeed-MM's "
                                     "mllm_format (messages + images), the layout data.json's dataset files use.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    parser.add_argument("input", help="LLaVA-Instruct JSON, e.g. llava_instruct_150k.json")
    parser.add_argument("output", help="mllm_format JSON to write, e.g. mllm_format_llava_instruct_data.json")
    parser.add_argument("--image-prefix", default="./train2017",
                        help="prefix put before each image name (default: ./train2017, relative to dataset_dir)")
    parser.add_argument("--image-root", default=None,
                        help="skip samples whose image is missing under this folder (MindSpeed-MM's --coco_path), "
                             "e.g. ./data/COCO2017")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    args = parser.parse_args(argv)
    try:
        counts = convert_llava(args.input, args.output, args.image_prefix, args.image_root, args.overwrite)
    except DatasetConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    skipped = f"; skipped {counts['skipped']} whose image is missing" if counts["skipped"] else ""
    print(f"{PROG}: wrote {counts['converted']} samples to {args.output}{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
