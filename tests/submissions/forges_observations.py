"""Hostile: trains nothing and writes the observer's files itself, claiming two ranks on disjoint shards."""
import json
import os

rank = int(os.environ.get("RANK", "0"))
directory = os.environ["DISTLAB_OBSERVE_DIR"]  # where the observer writes: any program can read its environment
os.makedirs(directory, exist_ok=True)
indices = list(range(rank, 256, 2))
epoch = {"loader": 0, "dataset_len": 256, "sampler": "DistributedSampler", "batches": 4, "steps": 4,
         "batch_sizes": [32], "indices": indices, "started": 0.0, "step_times": [0.1, 0.2, 0.3, 0.4],
         "step_images": [32, 64, 96, 128]}
forged = {"schema": "distlab-observations", "schema_version": 1, "rank": rank, "rank_source": "RANK",
          "pid": 4242 + rank, "argv": [__file__], "process_groups": [{"api": "torch", "backend": "gloo",
                                                                       "world_size": 2, "rank": rank}],
          "optimizer_steps": 8, "loader_passes": [epoch, {**epoch, "indices": indices[::-1]}], "saves": [],
          "model": {"class": "Net", "tensors": 2, "state_sha256": "0" * 64, "params_sha256": "0" * 64,
                    "buffers_sha256": "0" * 64, "weights_file": None}, "errors": []}
with open(os.path.join(directory, f"rank.{rank}.json"), "w") as out:
    json.dump(forged, out)
