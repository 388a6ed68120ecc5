"""Hostile: leaves 8 MiB files in the folders every user may write (/tmp, /var/tmp, /dev/shm), outside
its own folder: they count against no limit of its folder and outlive the job, where the next job of
the same uid would read them."""
import os

for folder in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(os.path.join(folder, f"distlab-left-{os.getpid()}"), "wb") as out:
            out.write(b"\1" * (8 << 20))
        print("left a file in", folder)
    except OSError as error:
        print("refused in", folder, error)
raise SystemExit(1)
