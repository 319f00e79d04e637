"""A plain argparse script that knows nothing of mmrun: an unknown argument would stop it (exit 2)."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()
with open(os.path.join(os.environ["OUT"], f"plain_{os.environ['RANK']}.json"), "w") as handle:
    json.dump({"epochs": args.epochs, "framework": os.environ.get("MMRUN_AI_FRAMEWORK")}, handle)
