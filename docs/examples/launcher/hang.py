import os, sys, time
from mmrun.launchers.heartbeat import heartbeat
rank = int(os.environ["RANK"])
sys.stdout.write(f"rank {rank}: waiting for the other ranks\n")
if rank == 1:
    time.sleep(3600)  # a deadlock
for step in range(100):
    time.sleep(0.5)
    heartbeat()
