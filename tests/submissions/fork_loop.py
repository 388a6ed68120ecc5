"""Hostile: leaves a process behind that forks a new pid every 50 ms (each parent exits), so that no one
pid lives long enough to be found and ended; each one touches a mark in the run's folder, so its
end shows. Rank 0 exits only once the first mark is written, and the other ranks only once they see
it: on a busy machine the launcher's teardown, which the first rank to exit starts, could otherwise
end the child before it wrote anything, or rank 0 before it forked, and the test would see no marks."""
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
else:  # the run's folder is every rank's working folder; bounded, for a rank 0 that never starts
    deadline = time.monotonic() + 120
    while not os.path.exists("alive.0") and time.monotonic() < deadline:
        time.sleep(0.05)
raise SystemExit(1)
