"""Rank KILL_RANK prints a line, notes the time, and is killed by KILL_SIGNAL (default SIGKILL); others sleep $SLEEP.

WHO=script kills the script's own process; WHO=bootstrap kills its parent, the mmrun worker bootstrap."""
import json
import os
import resource
import signal
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} started", flush=True)
if rank == int(os.environ.get("KILL_RANK", "-1")):
    time.sleep(0.5)
    print(f"rank {rank} is about to be killed", flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's folder
    victim = os.getppid() if os.environ.get("WHO") == "bootstrap" else os.getpid()
    with open(os.path.join(os.environ["OUT"], "killed.json"), "w") as handle:
        json.dump({"time": time.time(), "victim": victim}, handle)
    os.kill(victim, getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL")))
    time.sleep(60)
time.sleep(float(os.environ.get("SLEEP", "0")))
