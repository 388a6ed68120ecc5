"""The communication backends, named once for the labs and the harness (standard library only)."""

TORCH_BACKENDS = ("gloo", "nccl")  # torch.distributed process groups
ALL_BACKENDS = ("gloo", "nccl", "mpi", "horovod")  # plus mpi4py and Horovod
