"""Writes the torch-style rank variables and the script's argv to $OUT/rank_<RANK>.json, then sleeps $SLEEP."""
import json
import os
import sys
import time

names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MMRUN_AI_FRAMEWORK",
         "MMRUN_STATUS_DIR")
record = {name: os.environ.get(name) for name in names}
record["argv"] = sys.argv[1:]
record["pid"] = os.getpid()
record["ms_vars"] = sorted(k for k in os.environ if k.startswith("MS_"))
path = os.path.join(os.environ["OUT"], f"rank_{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)
time.sleep(float(os.environ.get("SLEEP", "0")))
