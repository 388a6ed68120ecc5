"""The all-reduce bandwidth benchmark (nccl-tests style), on every backend the collectives table knows."""
