"""Rank HANG_RANK prints a line and hangs; the others call heartbeat() and print nothing, for $SLEEP seconds."""
import os
import time

from mmrun.launchers.heartbeat import heartbeat

rank = int(os.environ["RANK"])
if rank == int(os.environ.get("HANG_RANK", "-1")):
    print(f"rank {rank}: waiting for a message that never comes", flush=True)
    time.sleep(3600)
deadline = time.monotonic() + float(os.environ.get("SLEEP", "0"))
while time.monotonic() < deadline:
    heartbeat()
    time.sleep(0.2)
