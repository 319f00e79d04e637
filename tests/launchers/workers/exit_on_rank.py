"""Rank FAIL_RANK prints a line to stderr and exits with FAIL_CODE; the others wait for the launcher to stop them."""
import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} started", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(0.5)
    print(f"rank {rank} is about to fail", file=sys.stderr, flush=True)
    sys.exit(int(os.environ["FAIL_CODE"]))
time.sleep(float(os.environ.get("SLEEP", "0")))
