"""A distributed script that relies on Python's exit: an unclosed file, a non-daemon thread, an atexit
handler, and rank 1's own exit code. The bootstrap ends torch workers without interpreter finalization;
all of these must still happen."""
import atexit
import os
import threading
import time

from mmrun import backend

info = backend.init_distributed()
out = os.environ["OUT"]
unclosed = open(os.path.join(out, f"unclosed_{info.rank}.txt"), "w")  # noqa: SIM115 - left open on purpose
unclosed.write("buffered, never closed\n")


def finish_later() -> None:
    time.sleep(0.5)
    with open(os.path.join(out, f"thread_{info.rank}.txt"), "w") as handle:
        handle.write("thread finished\n")


threading.Thread(target=finish_later).start()
atexit.register(lambda: open(os.path.join(out, f"atexit_{info.rank}.txt"), "w").write("atexit ran\n"))
raise SystemExit(5 if info.rank == 1 else 0)
