"""The rendezvous store of a torchrun run whose endpoint is on loopback: bound by the harness there,
served by a helper process of the run (torchrun's own store would listen on every interface)."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import subprocess

from harness.run.errors import RunRefused
from harness.run.request import RunRequest
from harness.run.state import PreparedRun


def bind_store(request: RunRequest) -> socket.socket | None:
    """Node 0 of a run whose rendezvous endpoint is on loopback binds the store's socket there.

    torchrun's own c10d store listens on every interface of the host whatever the endpoint says;
    so a helper of the run serves it from this socket instead, and every torchrun is a client.
    """
    endpoint = request.placement.get("rdzv_endpoint")
    if request.launcher != "torchrun" or not endpoint or request.placement.get("node_rank", 0) != 0:
        return None
    host, _, port = str(endpoint).rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None  # not resolvable here: checked, and reported, before the run by multinode
    if not infos or not all(is_loopback(str(info[4][0])) for info in infos):
        return None
    family, _, _, _, address = infos[0]
    try:
        return socket.create_server(address[:2], family=family, backlog=128)
    except OSError as error:
        raise RunRefused(f"rendezvous endpoint {endpoint} cannot be served here ({error.strerror}); "
                         "choose another port") from None


def serve_store(run: PreparedRun) -> subprocess.Popen[bytes]:
    assert run.store_socket is not None, "serve_store is called only for a run that bound one"
    fd = run.store_socket.fileno()
    port = run.store_socket.getsockname()[1]
    code = ("import sys; from harness.run.rendezvous import serve_rendezvous_store as serve; "
            "serve(int(sys.argv[1]), int(sys.argv[2]))")
    with (run.run_dir / "logs" / "rendezvous-store.log").open("wb") as log:
        return subprocess.Popen([run.request.python, "-c", code, str(fd), str(port), str(run.run_dir)], pass_fds=(fd,),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=run.env,
                                start_new_session=True)


def is_loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    return False


def serve_rendezvous_store(listen_fd: int, port: int) -> None:
    """Serve torchrun's c10d rendezvous store from a socket the harness bound on loopback, until
    killed (the harness stops it with the run). Started by the runner as a process of the run."""
    import datetime as dt

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=dt.timedelta(seconds=60), master_listen_fd=listen_fd)
    while store is not None:
        signal.pause()
