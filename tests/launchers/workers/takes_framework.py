"""A MindSpeed-style script: its parser declares the framework option, which mmrun then appends."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--ai-framework", required=True)
args = parser.parse_args()
with open(os.path.join(os.environ["OUT"], f"framework_{os.environ['RANK']}.json"), "w") as handle:
    json.dump({"ai_framework": args.ai_framework}, handle)
