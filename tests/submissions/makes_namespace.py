"""Hostile: makes a user namespace of its own (where it is root over its own mounts), then asks the
kernel's keyring to keep a key for whoever runs as its uid next."""
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
refused = []
if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
    refused.append(f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}")
if libc.syscall(248, b"user", b"distlab-channel", b"a secret", 6, -4) < 0:  # add_key(..., KEY_SPEC_USER_KEYRING)
    refused.append(f"add_key: {os.strerror(ctypes.get_errno())}")
print("refused:", refused, flush=True)
if refused:
    raise PermissionError(1, f"Operation not permitted: {'; '.join(refused)}")
print("made a user namespace and kept a key", flush=True)
