"""Score a Qwen2-VL / Qwen2.5-VL / Qwen3-VL on a benchmark, MindSpeed-MM's evaluate_vlm.py on PyTorch or MindSpore.

    mmrun --ai-framework pytorch   --nproc-per-node 2 models/evaluate_vlm.py --mm-model evaluate.json --load DIR
    mmrun --ai-framework mindspore --nproc-per-node 2 models/evaluate_vlm.py --mm-model evaluate.json --load DIR

--mm-model is MindSpeed-MM's evaluation json as it is: inference_vlm.py's keys (model_id Qwen2VlPipeline, the
model sections, tokenizer, generation_config, min/max_pixels, dtype, device) plus `evaluation_dataset`
(ai2d_test, mmmu_dev_val, chartqa_test, docvqa_val), `dataset_path` (VLMEvalKit's TSV with base64 images),
`evaluation_model` (the results' file name prefix) and `result_output_path` (a directory).

Each rank answers every world_size-th question (data parallel; any dataset size); the answers are gathered on
rank 0, which scores them (mmrun.data.evaluation: MindSpeed-MM's prompts, VLMEvalKit's answer extraction and
metrics) and writes, through the atomic writer:

    <result_output_path>/<evaluation_model>_<evaluation_dataset>.tsv       index, question, answer, prediction, score
    <result_output_path>/<evaluation_model>_<evaluation_dataset>_acc.json  {"scores": {"Overall": %, "split=..": %}}

and prints one summary line. Bad input (a TSV without a column the dataset needs, an image that will not
decode, a generation_config value of the wrong type, a prompt past the model's positions) is one line, exit 2.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from mmrun.backend.errors import UsageError
from mmrun.models.inference_vlm import Qwen2VlPipeline, entry_main, notice, parse_args, read_inference_json

RESULT_COLUMNS = ("index", "question", "answer", "prediction", "score", "extracted")


def read_evaluation_keys(raw: dict[str, Any], path: str) -> tuple[Any, str, Path, str]:
    from mmrun.data.evaluation.prompts import DATASETS

    name = raw.get("evaluation_dataset")
    if name not in DATASETS:
        raise UsageError(f"--mm-model {path}: evaluation_dataset {name!r} is not built; use one of "
                         f"{', '.join(DATASETS)}")
    for key in ("dataset_path", "result_output_path"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise UsageError(f"--mm-model {path}: {key} must be a path; received {raw.get(key)!r}")
    model_name = raw.get("evaluation_model") or "model"
    if not isinstance(model_name, str):
        raise UsageError(f"--mm-model {path}: evaluation_model must be a string; received {model_name!r}")
    custom = raw.get("use_custom_prompt", True)  # MindSpeed-MM's default; false: the dataset's own prompt
    if not isinstance(custom, bool) or (not custom and name.startswith("mmmu")):
        raise UsageError(f"--mm-model {path}: use_custom_prompt {custom!r} for {name}: "
                         + ("MMMU's own prompt (images split into the question) is not built; set it true"
                            if isinstance(custom, bool) else "use true or false"))
    return (dataclasses.replace(DATASETS[name], custom=custom), raw["dataset_path"], Path(raw["result_output_path"]),
            model_name)


def answer_rows(pipeline: Qwen2VlPipeline, rows: list[Any], dataset: Any, rank: int) -> dict[str, str]:
    """This rank's predictions {index: text}."""
    from mmrun.data.evaluation.prompts import build_prompt
    from mmrun.data.multimodal.vlm_prompt import decode_base64_image

    predictions = {}
    for number, row in enumerate(rows, 1):
        images = [decode_base64_image(image, f"dataset_path row {row.index}") for image in row.images]
        _, text, _ = pipeline.answer(build_prompt(row, dataset), images)
        predictions[row.index] = text
        if rank == 0:  # one rank's progress (the others answer as many questions, one fewer at most)
            print(f"[rank 0] {number}/{len(rows)} index {row.index}: {text!r}", file=sys.stderr, flush=True)
    return predictions


def write_results(rows: list[Any], predictions: dict[str, str], dataset: Any, out_dir: Path,
                  model_name: str) -> tuple[dict[str, float], Path, Path]:
    import csv
    import io

    from mmrun.common.atomic_write import atomic_write
    from mmrun.data.evaluation.metrics import score_row, summarize

    details = {row.index: score_row(row, predictions[row.index], dataset) for row in rows}
    summary = summarize(rows, {index: d["score"] for index, d in details.items()})
    extra = [c for c in ("split", "category", "hint") if any(row.get(c) is not None for row in rows)]
    table = io.StringIO()
    writer = csv.writer(table, delimiter="\t", lineterminator="\n")
    writer.writerow(list(RESULT_COLUMNS) + extra)
    for row in rows:
        d = details[row.index]
        writer.writerow([row.index, row.fields["question"], row.fields["answer"], predictions[row.index],
                         f"{d['score']:.6g}", d.get("extracted", "")] + [row.fields.get(c, "") for c in extra])
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{model_name}_{dataset.name}"
    results, scores = out_dir / f"{stem}.tsv", out_dir / f"{stem}_acc.json"
    atomic_write(results, table.getvalue())
    atomic_write(scores, json.dumps({"dataset": dataset.name, "metric": dataset.metric, "rows": len(rows),
                                     "scores": summary}, indent=2) + "\n")
    return summary, results, scores


def run(argv: list[str]) -> int:
    args, rest = parse_args(argv)
    raw = read_inference_json(args.mm_model)
    dataset, dataset_path, out_dir, model_name = read_evaluation_keys(raw, args.mm_model)

    from mmrun import backend
    from mmrun.data.evaluation.tsv import read_tsv

    rows = read_tsv(dataset_path, dataset.required)  # every rank checks the file before the model loads
    info = backend.init_distributed()
    rank, world = info.rank, info.world_size
    if rest and rank == 0:
        notice(f"ignored (each rank runs the whole model): {' '.join(a for a in rest if a.startswith('--'))}")
    pipeline = Qwen2VlPipeline(raw, args.mm_model, args.load, args.seed, quiet=rank != 0)
    start = time.perf_counter()
    predictions = answer_rows(pipeline, rows[rank::world], dataset, rank)
    if world > 1:
        gathered = backend.load().distributed.all_gather_object(predictions)
        predictions = {k: v for part in gathered for k, v in part.items()}
    if rank != 0:
        return 0
    summary, results, scores = write_results(rows, predictions, dataset, out_dir, model_name)
    details = ", ".join(f"{k} {v:.2f}" for k, v in summary.items() if k != "Overall")
    print(f"> {dataset.name}: {dataset.metric} {summary['Overall']:.2f} over {len(rows)} questions"
          f"{' (' + details + ')' if details else ''}, {world} rank(s), {time.perf_counter() - start:.1f} s, "
          f"{info.framework} on {info.device_kind}; results {results}, scores {scores}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return entry_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
