"""A DocVQA-style TSV (VLMEvalKit's columns: index, image as base64, question, answer as a list) from the
demo's pictures and captions. Usage: python make_tsv.py DEMO_DIR OUT.tsv [N]"""
import base64
import csv
import json
import sys
from pathlib import Path

demo, out = Path(sys.argv[1]), sys.argv[2]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 12
samples = [s for s in json.loads((demo / "data" / "demo.json").read_text()) if s.get("images")][:count]
with open(out, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")
    writer.writerow(["index", "image", "question", "answer"])
    for index, sample in enumerate(samples):
        image = base64.b64encode((demo / "data" / sample["images"][0]).read_bytes()).decode()
        question, answer = (m["content"] for m in sample["messages"][:2])
        writer.writerow([index, image, question.replace("<image>", ""), repr([answer])])
print(f"{out}: {len(samples)} questions")
