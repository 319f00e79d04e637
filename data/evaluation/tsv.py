"""VLMEvalKit's benchmark TSV files (AI2D_TEST.tsv, MMMU_DEV_VAL.tsv, ChartQA_TEST.tsv, DocVQA_VAL.tsv), read as
MindSpeed-MM's BaseEvalDataset reads them, with the standard library only.

One row per question: `index`, `image` (base64; a value of 64 characters or fewer names another row's index
whose image it shares; a "[...]" list holds several images), `question`, `answer`, and per dataset the option
columns `A`, `B`, ... (multiple choice), `hint`, `split`, `category`. Rows without an image are dropped (as
MindSpeed-MM's `data[~pd.isna(data['image'])]`); an empty cell is a missing value. Cells stay strings (pandas
would turn "1.50" into 1.5; the metrics compare text and numbers as VLMEvalKit does, so this only matters for
numeric strings with trailing zeros, which are then compared by value anyway).
"""
from __future__ import annotations

import ast
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from mmrun.backend.errors import UsageError

SHARED_IMAGE_MAX = 64  # VLMEvalKit: an `image` this short is the index of the row holding the image


class TSVError(UsageError):
    """A benchmark TSV that cannot be read or lacks a column the dataset needs."""


@dataclass
class Row:
    index: str
    fields: dict[str, str]  # every column, "" where empty
    images: list[str]  # base64 strings

    def get(self, name: str) -> str | None:
        """The cell, None when missing or empty (pandas' NaN)."""
        value = self.fields.get(name)
        return None if value is None or value == "" else value


def _as_list(value: str) -> list[str]:
    if value.startswith("[") and value.endswith("]"):
        try:
            return [str(x) for x in ast.literal_eval(value)]
        except (ValueError, SyntaxError):
            pass
    return [value]


def read_tsv(path: str | Path, required: tuple[str, ...]) -> list[Row]:
    """The rows of a VLMEvalKit TSV that have an image; `required` columns must exist (TSVError otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise TSVError(f"dataset_path {path}: no such file; pass VLMEvalKit's TSV of the dataset (e.g. AI2D_TEST.tsv)")
    csv.field_size_limit(sys.maxsize)  # base64 images are long cells
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        columns = reader.fieldnames or []
        missing = [c for c in required if c not in columns]
        if missing:
            raise TSVError(f"dataset_path {path}: no column {', '.join(missing)} (columns: "
                           f"{', '.join(columns) or 'none'}); pass VLMEvalKit's TSV of this evaluation_dataset")
        raw = [{k: (v or "") for k, v in record.items() if k is not None} for record in reader]
    raw = [r for r in raw if r["image"] != ""]
    by_index = {r["index"]: r["image"] for r in raw}
    rows = []
    for record in raw:
        image = record["image"]
        if len(image) <= SHARED_IMAGE_MAX:
            target = by_index.get(image, "")
            if len(target) <= SHARED_IMAGE_MAX:
                raise TSVError(f"dataset_path {path}: row {record['index']}'s image {image!r} names no row holding an "
                               "image; fix the TSV")
            image = target
        rows.append(Row(index=record["index"], fields=record, images=_as_list(image)))
    return rows
