"""Who am I: rank, local rank and world size, read from whichever launcher started this process.

A lab never spawns its own ranks. torchrun, horovodrun, mpirun (Open MPI or MPICH) and srun each
tell a process who it is through environment variables of their own; detect_topology reads the
first set it finds (labs/README.md, "Who am I"). Text for people is printed by rank 0 only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

# How each launcher tells a process who it is: (launcher, variable that marks it,
# rank, local rank, world size, local world size). First match wins: horovodrun --mpi
# sets both the Horovod and the Open MPI variables, torchrun only its own.
LAUNCHER_ENV = [
    ("torchrun", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpirun", "PMI_RANK", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),  # MPICH
    ("srun", "SLURM_PROCID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
]


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launcher: str = "none"
    hostname: str = field(default_factory=socket.gethostname)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def detect_topology(env: dict[str, str] | None = None) -> Topology:
    env = dict(os.environ) if env is None else env
    for launcher, marker, rank, local_rank, size, local_size in LAUNCHER_ENV:
        if marker in env:
            world_size = int(env[size])
            return Topology(
                rank=int(env[rank]),
                local_rank=int(env.get(local_rank, 0)),
                world_size=world_size,
                local_world_size=int(env.get(local_size, "").split("(")[0] or world_size),
                launcher=launcher,
            )
    return Topology()


def say(topology: Topology, *parts: Any) -> None:
    """Print for people: rank 0 only, flushed at once so launchers do not interleave lines."""
    if topology.is_rank0:
        print(*parts, flush=True)
