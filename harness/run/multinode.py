"""Several nodes: checking where ranks go before anything starts.

distlab starts nothing on other machines itself: torchrun meets its peers at a c10d
rendezvous endpoint (every node runs `distlab run` with its own --node-rank), and
mpirun/horovodrun start remote ranks over their own agents (ssh by default). This
module only validates those inputs so that mistakes fail fast with a clear message.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

MAX_HOSTFILE_BYTES = 1 << 20
# A host as launchers take it: a name, an IPv4 or a bracketed IPv6 address; never an option (-x).
HOST_NAME = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.:%\[\]-]{0,252}")
DIGITS = re.compile(r"[0-9]{1,5}")  # a port, a slot count


class PlacementError(ValueError):
    """Bad multi-node input; the message names the fix."""


def _host(name: str, where: str) -> str:
    if not HOST_NAME.fullmatch(name):
        raise PlacementError(f"{where}: {name!r} is not a host name or address (letters, digits, '.', '-', ':')")
    return name


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not DIGITS.fullmatch(port) or not 0 < int(port) < 65536 or not HOST_NAME.fullmatch(host):
        raise PlacementError(f"rendezvous endpoint {text!r} must be HOST:PORT, like node0:29400")
    return host.strip("[]"), int(port)


def resolve(host: str, what: str, wait_s: float = 0.0) -> str:
    """The host's address; with wait_s, retried until then: in a cluster a node's name may resolve only
    once its pod is up (Kubernetes publishes a pod's DNS name when the pod gets its address)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return str(socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0])
        except socket.gaierror as error:
            if time.monotonic() >= deadline:
                within = f" within {wait_s:g} s" if wait_s else ""
                raise PlacementError(f"{what} {host!r} does not resolve{within} ({error.strerror}); check the name "
                                     "in DNS or /etc/hosts on every node, or give an IP address") from None
        time.sleep(0.5)


def wait_reachable(host: str, port: int, timeout_s: float) -> None:
    """Connect to the rendezvous endpoint, retrying until timeout_s: node 0 may start later."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return
        except OSError as error:
            last = error
            time.sleep(0.5)
    raise PlacementError(f"rendezvous endpoint {host}:{port} not reachable within {timeout_s:g} s ({last}); "
                         "start node 0 first, open the port, or check the address")


def local_address_towards(address: str, port: int) -> str:
    """The address this machine uses to reach `address`: what its peers must dial back.

    A UDP connect sends nothing; it only asks the kernel which route and source it would use.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, port))
        return probe.getsockname()[0]


def parse_hosts(text: str, default_slots: int = 1) -> tuple[tuple[str, int], ...]:
    """'node0:2,node1:2' (slots after the colon; default_slots without one)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, slots = item.partition(":")
        if sep and (not DIGITS.fullmatch(slots) or int(slots) < 1):
            raise PlacementError(f"host {item!r}: slots must be a whole number >= 1, like {name}:2")
        hosts.append((_host(name, "--hosts"), int(slots) if sep else default_slots))
    return _no_repeats(hosts, "--hosts")


def parse_hostfile(path: Path) -> tuple[tuple[str, int], ...]:
    """Open MPI's format: `host slots=N`, one per line, # comments. Read only if it is a regular
    UTF-8 file of at most MAX_HOSTFILE_BYTES (a FIFO would block the harness)."""
    from harness.files import NotARegularFile, read_regular_file

    try:
        lines = read_regular_file(path, MAX_HOSTFILE_BYTES, follow=True).decode("utf-8").splitlines()
    except NotARegularFile as error:
        raise PlacementError(f"hostfile {error}") from None
    except UnicodeDecodeError as error:
        raise PlacementError(f"hostfile {path}: not UTF-8 text (byte {error.start}); write it as plain text") from None
    except OSError as error:
        raise PlacementError(f"hostfile {path}: {error.strerror or error}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots") and DIGITS.fullmatch(value) and int(value) >= 1:
                slots = int(value) if key == "slots" else slots
            else:
                raise PlacementError(f"hostfile {path}, line {number}: {word!r} is not slots=N")
        hosts.append((_host(words[0], f"hostfile {path}, line {number}"), slots))
    if not hosts:
        raise PlacementError(f"hostfile {path} names no host")
    return _no_repeats(hosts, f"hostfile {path}")


def _no_repeats(hosts: list[tuple[str, int]], where: str) -> tuple[tuple[str, int], ...]:
    seen = set()
    for name, _ in hosts:
        if name in seen:
            raise PlacementError(f"{where}: host {name} is listed twice; list each host once with its slots")
        seen.add(name)
    if not hosts:
        raise PlacementError(f"{where} names no host")
    return tuple(hosts)
