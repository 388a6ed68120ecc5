"""The shared training modules, in one process: data, model, sampler, replica checks, checkpoints, faults."""

from __future__ import annotations

import argparse
import json
import pickle
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from labs.common import data, faults, timing
from labs.common.checkpoints import load_checkpoint, save_checkpoint
from labs.common.contract import Record
from labs.common.data import (
    CIFAR10_FOLDER,
    CIFAR10_TEST_FILE,
    CIFAR10_TRAIN_FILES,
    SYNTHETIC_NOISE,
    EpochShuffle,
    ImageSet,
    augment,
    fetch_cifar10,
    load_datasets,
    synthetic_cifar10,
    train_loader,
)
from labs.common.faults import fault_point, parse_fault, skip_all_reduce, skips_collective
from labs.common.models import build_model
from labs.common.optim import make_optimizer, steps_per_epoch
from labs.common.replicas import check_replicas
from labs.common.timing import History, TrainClock
from labs.common.topology import Topology


def data_args(**overrides) -> argparse.Namespace:
    values = {"dataset": "synthetic", "data_dir": Path("unused"), "train_size": 64, "test_size": 32, "augment": False,
              "synthetic_noise": SYNTHETIC_NOISE,
              "seed": 0, "workers": 0, "device": "cpu", "stem": "standard", "epochs": 3, "momentum": 0.9,
              "weight_decay": 5e-4}
    return argparse.Namespace(**{**values, **overrides})


# ------------------------------------------------------------------------------------- synthetic data


def test_synthetic_is_deterministic_and_shaped_like_cifar10():
    first, second = synthetic_cifar10(200, 50), synthetic_cifar10(200, 50)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    train_images, train_labels, test_images, test_labels = first
    assert train_images.shape == (200, 3, 32, 32) and train_images.dtype == torch.uint8
    assert test_images.shape == (50, 3, 32, 32)
    assert set(train_labels.tolist()) == set(range(10))
    assert not torch.equal(train_images[:50], test_images), "the test set must be drawn apart from the training set"


def ridge_accuracy(train_features, train_labels, test_features, test_labels, penalty):
    """Test accuracy of a linear least-squares classifier (one-hot targets, ridge penalty)."""
    def with_bias(features):
        return torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], 1)

    x = with_bias(train_features)
    targets = torch.nn.functional.one_hot(train_labels, 10).to(x.dtype)
    weights = torch.linalg.solve(x.T @ x + penalty * torch.eye(x.shape[1], dtype=x.dtype), x.T @ targets)
    return ((with_bias(test_features) @ weights).argmax(1) == test_labels).double().mean().item()


def test_synthetic_labels_depend_on_the_images_and_not_linearly():
    train_images, train_labels, test_images, test_labels = synthetic_cifar10(2000, 500)

    def spectrum(images):  # phase-free: how much of each spatial frequency an image holds
        return torch.fft.rfft2(images.double() / 255).abs().flatten(1)

    def pixels(images):
        return torch.nn.functional.avg_pool2d(images.double() / 255, 4).flatten(1)

    # The label is a function of the image: a linear classifier on the spectrum gets most right...
    assert ridge_accuracy(spectrum(train_images), train_labels, spectrum(test_images), test_labels, 10.0) > 0.8
    # ...but on the pixels themselves it is near chance (10%): a network has features to learn.
    assert ridge_accuracy(pixels(train_images), train_labels, pixels(test_images), test_labels, 1e-2) < 0.3


# ------------------------------------------------------------------------------- CIFAR-10's own format


def write_cifar10(folder: Path, per_file: int = 4) -> tuple[np.ndarray, list[int]]:
    """A tiny CIFAR-10 in its own format: pickled dicts of N x 3072 uint8 rows (R plane, G plane, B plane)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    all_data, all_labels = [], []
    for name in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE):
        data = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_file).tolist()
        with open(folder / name, "wb") as handle:
            pickle.dump({"batch_label": name, "labels": labels, "data": data,
                         "filenames": [f"{i}.png" for i in range(per_file)]}, handle, protocol=2)
        all_data.append(data)
        all_labels += labels
    return np.concatenate(all_data), all_labels


@pytest.mark.parametrize("layout", ["torchvision", "flat"])
def test_cifar10_is_read_from_its_own_pickle_format(tmp_path, layout):
    data_dir = tmp_path / "data"
    data, labels = write_cifar10(data_dir / CIFAR10_FOLDER if layout == "torchvision" else data_dir)
    train_set, test_set = load_datasets(data_args(dataset="cifar10", data_dir=data_dir, train_size=20, test_size=4))
    assert len(train_set) == 20 and len(test_set) == 4
    # Row 5 is the second file's first image; its first 1024 bytes are the red plane, row-major.
    images, batch_labels, indices = train_set.__getitems__([5])
    assert torch.equal(images[0, 0], torch.as_tensor(data[5, :1024]).view(32, 32))
    assert torch.equal(images[0, 2], torch.as_tensor(data[5, 2048:]).view(32, 32))
    assert batch_labels.tolist() == [labels[5]] and indices.tolist() == [5]
    test_images, test_labels, _ = test_set.__getitems__([0, 3])
    assert torch.equal(test_images.flatten(1), torch.as_tensor(data[[20, 23]]))
    assert test_labels.tolist() == [labels[20], labels[23]]


def one_line_exit(capsys, call) -> str:
    with pytest.raises(SystemExit) as stop:
        call()
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


def test_missing_cifar10_says_how_to_stage_it(tmp_path, capsys):
    message = one_line_exit(capsys, lambda: load_datasets(data_args(dataset="cifar10", data_dir=tmp_path)))
    assert "distlab data --data-dir" in message and CIFAR10_FOLDER in message


def test_a_damaged_cifar10_file_is_refused(tmp_path, capsys):
    write_cifar10(tmp_path / CIFAR10_FOLDER)
    (tmp_path / CIFAR10_FOLDER / "data_batch_3").write_bytes(b"\x80\x02not a pickle")
    message = one_line_exit(capsys, lambda: load_datasets(data_args(dataset="cifar10", data_dir=tmp_path,
                                                                    train_size=8, test_size=4)))
    assert "data_batch_3" in message


def test_fetch_offline_says_how_to_stage(tmp_path, capsys, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(data.torchvision.datasets, "CIFAR10", offline)
    message = one_line_exit(capsys, lambda: fetch_cifar10(tmp_path))
    assert "could not download" in message and CIFAR10_FOLDER in message


# ------------------------------------------------------------------------------ sampling, augmentation


def test_epoch_shuffle_is_distributed_samplers_order_and_changes_each_epoch():
    dataset = list(range(100))
    baseline, reference = EpochShuffle(100, seed=7), DistributedSampler(dataset, num_replicas=1, rank=0, seed=7)
    orders = []
    for epoch in range(3):
        baseline.set_epoch(epoch)
        reference.set_epoch(epoch)
        orders.append(list(baseline))
        assert orders[-1] == list(reference)
        assert sorted(orders[-1]) == dataset
    assert len({tuple(order) for order in orders}) == 3  # every epoch its own order, the first and third too


def test_ranks_split_the_baselines_global_batches():
    # The premise of the oracle test: with drop_last, step s of ranks 0..W-1 (b samples each) trains
    # on exactly the samples of the baseline's step s with batch W*b.
    size, world_size, per_rank = 96, 2, 8
    baseline = list(EpochShuffle(size, seed=3))
    shards = [list(DistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=3, drop_last=True))
              for rank in range(world_size)]
    global_batch = world_size * per_rank
    for step in range(size // global_batch):
        together = sorted(i for shard in shards for i in shard[step * per_rank:(step + 1) * per_rank])
        assert together == sorted(baseline[step * global_batch:(step + 1) * global_batch])


def test_augment_crops_a_padded_window_and_is_reproducible():
    images = torch.arange(2 * 3 * 32 * 32, dtype=torch.int32).view(2, 3, 32, 32).to(torch.uint8)
    first = augment(images, torch.Generator().manual_seed(1))
    assert torch.equal(first, augment(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, augment(images, torch.Generator().manual_seed(2)))
    padded = torch.nn.functional.pad(images, [4] * 4)
    for image, out in zip(padded, first, strict=True):
        windows = [image[:, y:y + 32, x:x + 32] for y in range(9) for x in range(9)]
        assert any(torch.equal(out, w) or torch.equal(out, w.flip(-1)) for w in windows)


def test_loader_batches_carry_their_indices_and_drop_the_partial_batch():
    train_set, _ = load_datasets(data_args(train_size=50, augment=True))
    sampler = EpochShuffle(len(train_set), seed=0)
    batches = list(train_loader(train_set, sampler, 16, data_args()))
    assert len(batches) == 3  # 50 images: three full batches of 16, the last 2 dropped
    assert torch.cat([indices for _, _, indices in batches]).tolist() == list(sampler)[:48]
    images, labels, indices = batches[0]
    assert images.shape == (16, 3, 32, 32) and torch.equal(labels, train_set.labels[indices])


def test_steps_per_epoch_refuses_a_global_batch_larger_than_the_data(capsys):
    assert steps_per_epoch(100, 32) == 3
    assert "world size" in one_line_exit(capsys, lambda: steps_per_epoch(100, 128))


# ------------------------------------------------------------------------------------------------ model


@pytest.mark.parametrize(("stem", "layer1_size"), [("cifar", 32), ("standard", 8)])
def test_stems_keep_or_shrink_the_resolution(stem, layer1_size):
    model = build_model(stem).eval()
    seen = {}
    model.layer1.register_forward_hook(lambda module, inputs, output: seen.update(shape=output.shape))
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert seen["shape"][-1] == layer1_size


def test_train_clock_leaves_out_start_up_and_the_time_between_epochs(monkeypatch):
    now = iter([0.0, 1.0, 5.0, 20.0, 21.0, 23.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(now))  # the clock the labs read
    clock = TrainClock(torch.device("cpu"), skip=1)
    clock.start_epoch()            # t=0
    clock.step(10)                 # step 1 is start-up: the clock starts at t=1
    clock.step(10)
    assert clock.end_epoch() == 5  # t=5: the epoch took 5 s, 4 of them timed
    clock.start_epoch()            # t=20: 15 s of evaluation in between, not timed
    clock.step(10)
    clock.end_epoch()              # t=21
    assert clock.images == 20 and clock.seconds == 5 and clock.img_per_sec == 4
    clock.start_epoch()            # t=23
    assert clock.mark == 23


# ---------------------------------------------------------------------------------- end-of-run checks


def checked(reports, train_images=8, global_batch=4):
    record = Record(lab="t", config={}, topology=Topology(), backend="gloo")
    check_replicas(record, reports, train_images, global_batch, first_epoch=0)
    return record


def rank(digest, *orders, buffers="x"):
    return {"rank": 0, "device": "cpu", "params_sha256": digest, "buffers_sha256": buffers, "img_per_sec": 1.0,
            "orders": list(orders)}


def test_replica_checks_pass_a_correct_run_and_fingerprint_it():
    record = checked([rank("a", [0, 1, 2, 3], [4, 5, 6, 7]), rank("a", [4, 5, 6, 7], [0, 1, 2, 3])])
    assert record.status == "ok" and set(record.checks) == {
        "params_identical", "buffers_identical", "shards_disjoint", "shards_cover", "order_changes_per_epoch"}
    fingerprints = record.metrics["sample_order"]
    assert [f["epoch"] for f in fingerprints] == [0, 1]
    assert fingerprints[0]["ranks"][0] == fingerprints[1]["ranks"][1]  # same list, same fingerprint
    assert fingerprints[0]["ranks"][0]["count"] == 4
    assert fingerprints[0]["ranks"][0]["sha256"] != fingerprints[1]["ranks"][0]["sha256"]


@pytest.mark.parametrize(("reports", "failed"), [
    ([rank("a", [0, 1, 2, 3], [4, 5, 6, 7]), rank("b", [4, 5, 6, 7], [0, 1, 2, 3])], ["params_identical"]),
    # BatchNorm statistics left as each rank's batches made them
    ([rank("a", [0, 1, 2, 3], [4, 5, 6, 7]), rank("a", [4, 5, 6, 7], [0, 1, 2, 3], buffers="y")],
     ["buffers_identical"]),
    # a sample trained twice is also one sample too few
    ([rank("a", [0, 1, 2, 3], [4, 5, 6, 7]), rank("a", [3, 5, 6, 7], [0, 1, 2, 3])],
     ["shards_disjoint", "shards_cover"]),
    ([rank("a", [0, 1, 2], [4, 5, 6, 7]), rank("a", [4, 5, 6], [0, 1, 2, 3])], ["shards_cover"]),
    ([rank("a", [0, 1, 2, 3], [0, 1, 2, 3]), rank("a", [4, 5, 6, 7], [4, 5, 6, 7])], ["order_changes_per_epoch"]),
])
def test_replica_checks_catch_each_fault(reports, failed):
    record = checked(reports)
    assert record.status == "failed"
    assert [name for name, check in record.checks.items() if not check["passed"]] == failed


def test_the_run_rate_is_the_sum_of_the_ranks_rates():
    reports = [rank("a", [0, 1, 2, 3]), rank("a", [4, 5, 6, 7])]
    reports[0]["img_per_sec"], reports[1]["img_per_sec"] = 30.0, 12.5
    record = Record(lab="t", config={}, topology=Topology(), backend="gloo")
    assert check_replicas(record, reports, 8, 4, first_epoch=0) == 42.5
    assert [r["img_per_sec"] for r in record.ranks] == [30.0, 12.5] and "orders" not in record.ranks[0]
    # A rank that timed no step (too few steps for the warm-up) leaves the run without a rate.
    reports = [rank("a", [0, 1, 2, 3]), {**rank("a", [4, 5, 6, 7]), "img_per_sec": None}]
    assert check_replicas(Record(lab="t", config={}, topology=Topology(), backend="gloo"), reports, 8, 4, 0) is None


def test_one_epoch_claims_no_order_check():
    assert "order_changes_per_epoch" not in checked([rank("a", [0, 1, 2, 3]), rank("a", [4, 5, 6, 7])]).checks


# ------------------------------------------------------------------------------------------ checkpoints


def tiny_model(width: int = 4) -> torch.nn.Module:
    """Checkpoints do not care which network they hold: a small one keeps these tests fast."""
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 2))


def saved_checkpoint(path: Path, stem: str = "standard", global_batch: int = 32, width: int = 4):
    args = data_args(stem=stem)
    model = tiny_model(width)
    optimizer = make_optimizer(model, 0.1, args)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()  # momentum buffers exist: the optimizer state is not empty
    history = History([2.0], [0.3], [1.5], 1.7)
    save_checkpoint(path, model, optimizer, 1, 12, history, args, global_batch)
    return model, history


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "run" / "model.pt"
    saved, history = saved_checkpoint(path)
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]  # no temporary file left behind
    model = tiny_model()
    optimizer = make_optimizer(model, 0.1, data_args())
    epoch, step, loaded = load_checkpoint(path, model, optimizer, torch.device("cpu"), data_args(), 32)
    assert (epoch, step, loaded) == (1, 12, history)
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), model.state_dict().values(), strict=True))
    assert len(optimizer.state) == len(list(model.parameters()))


@pytest.mark.parametrize(("damage", "expected"), [
    ("truncate", "not a readable checkpoint"),
    ("other_stem", "resume with the same --stem"),
    ("other_shape", "does not fit this model"),
    ("other_batch", "same --batch-size"),
    ("plain_state_dict", "not a distlab training checkpoint"),
    ("finished", "raise --epochs"),
])
def test_unusable_checkpoints_are_refused_and_left_alone(tmp_path, capsys, damage, expected):
    path = tmp_path / "model.pt"
    args = data_args()
    if damage == "truncate":
        saved_checkpoint(path)
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "other_stem":
        saved_checkpoint(path, stem="cifar")
    elif damage == "other_shape":
        saved_checkpoint(path, width=5)
    elif damage == "other_batch":
        saved_checkpoint(path, global_batch=64)
    elif damage == "plain_state_dict":
        torch.save(tiny_model().state_dict(), path)
    else:
        saved_checkpoint(path)
        args = data_args(epochs=1)
    before = path.read_bytes()
    model = tiny_model()
    message = one_line_exit(capsys, lambda: load_checkpoint(path, model, make_optimizer(model, 0.1, args),
                                                            torch.device("cpu"), args, 32))
    assert expected in message
    assert path.read_bytes() == before


# ----------------------------------------------------------------------------------------------- faults


def test_fault_specs():
    fault = parse_fault("crash:rank=1:step=20")
    assert (fault.kind, fault.rank, fault.step) == ("crash", 1, 20)
    assert json.dumps({"fault": fault}) == '{"fault": "crash:rank=1:step=20"}'  # the record's config holds it
    assert parse_fault("hang:step=3:rank=0").kind == "hang"
    assert parse_fault("skip:rank=1:step=2").kind == "skip"
    for bad in ("crash", "crash:rank=1", "explode:rank=0:step=1", "crash:rank=x:step=1", "crash:rank=0:step=0",
                "crash:rank=0:step=1:extra=2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_fault(bad)


def test_a_skip_fault_fires_once_on_its_rank_and_never_after_a_restart(monkeypatch, capsys):
    fault = parse_fault("skip:rank=1:step=2")
    assert not skips_collective(fault, 0, 2) and not skips_collective(fault, 1, 1)
    assert skips_collective(fault, 1, 2)
    # Once: a rank that left its step out still counts that step as next, and must then run it.
    assert not skips_collective(fault, 1, 2)
    assert "fault: skip on rank 1 at step 2" in capsys.readouterr().out
    assert not skips_collective(parse_fault("crash:rank=1:step=2"), 1, 2)  # other kinds fire elsewhere
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not skips_collective(parse_fault("skip:rank=1:step=2"), 1, 2)


def test_imageset_single_item_matches_its_batch():
    images, labels = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([3, 1, 4, 1])
    dataset = ImageSet(images, labels, augment=False)
    image, label, index = dataset[2]
    assert torch.equal(image, images[2]) and label.item() == 4 and index.item() == 2


class Stop(Exception):
    pass


def test_crash_and_hang_faults_fire_after_their_step_on_their_rank_only(monkeypatch, capsys):
    exits, sleeps = [], []

    def exit_(code):
        exits.append(code)
        raise Stop

    def sleep(seconds):
        sleeps.append(seconds)
        raise Stop  # a hang sleeps forever: one sleep is enough to see it

    monkeypatch.setattr(faults.os, "_exit", exit_)
    monkeypatch.setattr(faults.time, "sleep", sleep)
    crash = parse_fault("crash:rank=1:step=3")
    for rank_, step in [(0, 3), (1, 2), (1, 4)]:
        fault_point(crash, rank_, step)
    assert exits == [] and sleeps == []
    with pytest.raises(Stop):
        fault_point(crash, 1, 3)
    assert exits == [3] and "fault: crash on rank 1 at step 3" in capsys.readouterr().out
    fault_point(parse_fault("skip:rank=1:step=3"), 1, 3)  # a skip fires before the step, not here
    with pytest.raises(Stop):
        fault_point(parse_fault("hang:rank=0:step=1"), 0, 1)
    assert exits == [3] and sleeps == [3600]


def test_a_ddp_skip_fault_runs_every_micro_batch_of_its_step_inside_no_sync():
    events = []

    class NoSync:
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    fault = parse_fault("skip:rank=1:step=2")
    assert list(skip_all_reduce(fault, 0, 2, [1, 2], NoSync)) == [1, 2] and events == []  # another rank
    assert list(skip_all_reduce(fault, 1, 1, [1, 2], NoSync)) == [1, 2] and events == []  # another step
    for micro_batch in skip_all_reduce(fault, 1, 2, ["a", "b"], NoSync):
        events.append(micro_batch)  # what the lab's forward and backward do with it
    # Entered before the first micro-batch, left only after the last one's backward: the step's
    # all-reduce, which DDP starts from the last backward, never happens on this rank.
    assert events == ["enter", "a", "b", "exit"]
    assert list(skip_all_reduce(fault, 1, 2, [1], NoSync)) == [1] and events[-1] == "exit"  # once only
