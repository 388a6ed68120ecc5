"""The system calls refused inside the sandbox, as a classic BPF program."""

from __future__ import annotations

import os

# System calls refused inside the sandbox, where the namespaces leave a way out or a channel:
# the kernel's keyrings are per uid and outlive a job (a later job could read a key an earlier one
# left), and a user namespace made inside would give the program capabilities over its own mounts.
# (name: x86_64 number, aarch64 number); clone and unshare are refused with CLONE_NEWUSER only.
SYSCALLS = {"keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
            "unshare": (272, 97), "clone": (56, 220), "clone3": (435, 435)}
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column in SYSCALLS
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno


Step = tuple[int, str | None, str | None, int]  # (code, jump if true -> label, if false -> label, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The sandbox's seccomp program (classic BPF, as bwrap --seccomp takes it) for this machine's
    architecture; None on another (then the namespaces alone hold). System calls of another ABI
    (i386's int 0x80, x32 on x86_64) get ENOSYS: their numbers differ and would slip past."""
    import errno
    import platform
    import struct

    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, column = arch
    number = {name: numbers[column] for name, numbers in SYSCALLS.items()}
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    # (code, jump if true -> label, jump if false -> label, k); labels resolved below.
    program: list[Step | tuple[str, int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, 4),  # seccomp_data.arch
        (_JEQ, None, "enosys", audit_arch),
        (_LD_ABS, None, None, 0),  # seccomp_data.nr
        *([(_JGE, "enosys", None, X32_SYSCALL_BIT)] if audit_arch == ARCHES["x86_64"][0] else []),
        *((_JEQ, "eperm", None, number[name]) for name in ("keyctl", "add_key", "request_key")),
        (_JEQ, "enosys", None, number["clone3"]),  # its flags are in memory a filter cannot read: libc falls back
        (_JEQ, "flags", None, number["unshare"]),
        (_JEQ, "flags", None, number["clone"]),
        (_RET, None, None, _ALLOW),
        ("flags", _LD_ABS, None, None, 16),  # args[0], its low 32 bits: the flags of clone and unshare
        (_JSET, "eperm", None, CLONE_NEWUSER),
        (_RET, None, None, _ALLOW),
        ("eperm", _RET, None, None, eperm),
        ("enosys", _RET, None, None, enosys),
    ]
    labels: dict[str, int] = {}
    steps: list[Step] = []
    for step in program:
        if len(step) == 5:  # a step with its label first
            labels[step[0]] = len(steps)
            steps.append(step[1:])
        else:
            steps.append(step)
    out = b""
    for index, (code, if_true, if_false, k) in enumerate(steps):
        jump: dict[str | None, int] = {None: 0, **{name: target - index - 1 for name, target in labels.items()}}
        out += struct.pack("=HBBI", code, jump[if_true], jump[if_false], k)
    return out


def load_seccomp() -> bool:
    """The filter loaded into this process (and all it execs) by prctl, as bwrap does with --seccomp:
    for uid mode, which has no bwrap. False where there is no filter for this machine."""
    import ctypes

    program = seccomp_filter()
    if program is None:
        return False

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    steps = ctypes.create_string_buffer(program, len(program))
    fprog = Program(len(program) // 8, ctypes.cast(steps, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0 or \
            libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")
    return True


def seccomp_fd() -> int | None:
    """The filter in a memory file bwrap reads (--seccomp FD); None where there is none for this machine."""
    program = seccomp_filter()
    if program is None:
        return None
    fd = os.memfd_create("distlab-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
