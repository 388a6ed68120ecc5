"""Hostile: leaves a process behind that forks a new pid every 50 ms (each parent exits), so that no one
pid lives long enough to be found and ended; each one touches a mark in the run's folder, so its
end shows."""
import os
import time

if os.environ.get("RANK", "0") == "0" and os.fork() == 0:
    os.setsid()
    for number in range(100_000):
        with open(f"alive.{number % 100}", "w") as mark:
            mark.write(f"{time.time()}\n")
        time.sleep(0.05)
        if os.fork() != 0:
            os._exit(0)
raise SystemExit(1)
