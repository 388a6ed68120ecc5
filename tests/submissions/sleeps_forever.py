"""Hostile: never ends."""
import time

while True:
    time.sleep(3600)
