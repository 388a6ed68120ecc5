"""Hostile, the other end of makes_namespace.py's channel: graded after it as the same uid, it looks
for the key that one left in the uid's keyring and prints what it holds."""
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
key = libc.syscall(249, b"user", b"distlab-channel", None, 0)  # request_key: searches the uid's keyrings
if key < 0:
    print(f"no key from an earlier job ({os.strerror(ctypes.get_errno())})", flush=True)
else:
    payload = ctypes.create_string_buffer(64)
    size = libc.syscall(250, 11, key, payload, 64)  # keyctl(KEYCTL_READ)
    print(f"read an earlier job's key: {payload.raw[:max(size, 0)]!r}", flush=True)
