"""What the backend watchers of the drain cases share (drain_trainer,
drain_overwrite, s3_trainer): poll until the case says stop, then once
more, so the last look sees the drained state."""
import os
import time


def watch(stop_path, poll, interval):
    """Calls poll() every `interval` seconds until `stop_path` exists, and
    once after it appears."""
    while True:
        done = os.path.exists(stop_path)
        poll()
        if done:
            return
        time.sleep(interval)
