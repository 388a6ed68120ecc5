"""Hostile: leaves a process behind that forks a new pid every 50 ms (each parent exits), so that no one
pid lives long enough to be found and ended; each one touches a mark in the run's folder, so its
end shows. Rank 0 exits only once the first mark is written: on a busy machine the launcher's
teardown could otherwise end the child before it wrote anything, and the test would see no marks."""
import os
import time

if os.environ.get("RANK", "0") == "0":
    first_mark_written, told = os.pipe()
    if os.fork() == 0:
        os.close(first_mark_written)
        os.setsid()
        for number in range(100_000):
            with open(f"alive.{number % 100}", "w") as mark:
                mark.write(f"{time.time()}\n")
            if number == 0:
                os.write(told, b"1")
                os.close(told)
            time.sleep(0.05)
            if os.fork() != 0:
                os._exit(0)
        os._exit(0)
    os.close(told)
    os.read(first_mark_written, 1)
raise SystemExit(1)
