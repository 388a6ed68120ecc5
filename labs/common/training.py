"""What the three training labs share: flags, data, model, schedule, timing, checkpoints.

labs/baseline/train.py, labs/ddp/train.py and labs/horovod/train.py keep only what differs between
one device, DDP and Horovod; everything here is the same for all three, so that diffing two labs
shows exactly what distribution adds. The end-of-run checks of the distributed labs are in
labs/common/replicas.py, the injected faults in labs/common/faults.py.

Data: CIFAR-10 in its own pickle format (fetched once by `distlab data`, or staged by hand), or a
synthetic set of the same shape whose labels really depend on the images, so accuracy means
something offline. Images stay in memory as uint8; the training set is augmented a batch at a
time (random crop with 4 pixels of padding, horizontal flip) and normalised on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import math
import os
import pickle
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from labs.common import timing
from labs.common.host import rank_device
from labs.common.topology import detect_topology

CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
CIFAR10_FOLDER = "cifar-10-batches-py"  # the folder name inside torchvision's download, and the original tarball's
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_SIZES = (50_000, 10_000)
# Per-channel mean and standard deviation of CIFAR-10's training set, in [0, 1] pixel units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CROP_PADDING = 4  # pixels added on each side before the random 32x32 crop (the standard CIFAR augmentation)
SYNTHETIC_SEED = 1234  # fixed: like a real data set, the synthetic images do not change with --seed
SYNTHETIC_WAVES = 2  # plane waves per class texture
SYNTHETIC_NOISE = 1.5  # pixel noise, in units of one wave's mean amplitude (--synthetic-noise)
TIMING_WARMUP_STEPS = 3  # first steps of a run left out of img_per_sec: allocator, cuDNN autotuning, workers
CHECKPOINT_FORMAT = "distlab-train-checkpoint"
DEFAULT_DATA_DIR = Path(os.environ.get("DISTLAB_DATA_DIR", "data"))

# Defaults a flag takes when it is not given. FULL trains the course's ResNet-18 on CIFAR-10;
# SMOKE runs in seconds on a CPU (tests use it). Flags given on the command line always win.
# SMOKE's learning rate is FULL's scaled to its smaller batch (0.1 per 128 images).
FULL = {"dataset": "cifar10", "train_size": None, "test_size": None, "epochs": 30, "batch_size": 128, "lr": 0.1,
        "stem": "cifar", "warmup_epochs": 2.0}
SMOKE = {"dataset": "synthetic", "train_size": 256, "test_size": 128, "epochs": 2, "batch_size": 32, "lr": 0.025,
         "stem": "standard", "warmup_epochs": 0.5}


# ---------------------------------------------------------------------------------------------- flags


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The flags all three training labs accept (defaults: FULL, or SMOKE with --smoke)."""
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=["cifar10", "synthetic"],
                      help="cifar10 (staged in --data-dir) or synthetic (generated, learnable); default cifar10, "
                           "synthetic with --smoke")
    data.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                      help="where CIFAR-10 is staged (env DISTLAB_DATA_DIR; default ./data)")
    data.add_argument("--train-size", type=int, help="training images used (default: all 50000; 256 with --smoke)")
    data.add_argument("--test-size", type=int, help="test images used (default: all 10000; 128 with --smoke)")
    data.add_argument("--synthetic-noise", type=float, default=SYNTHETIC_NOISE,
                      help=f"pixel noise of the synthetic set (default {SYNTHETIC_NOISE}: hard; less is easier)")
    data.add_argument("--no-augment", dest="augment", action="store_false",
                      help="no random crop or flip (runs become comparable sample for sample)")
    data.add_argument("--workers", type=int, help="DataLoader worker processes (default: 4 on GPU, 0 on CPU)")

    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, help="passes over the training set (default 30; 2 with --smoke)")
    train.add_argument("--batch-size", type=int,
                       help="images per process per optimizer step (default 128; 32 with --smoke)")
    train.add_argument("--accumulate", type=int, default=1,
                       help="split each batch into this many micro-batches (same result, less memory)")
    train.add_argument("--lr", type=float,
                       help="peak learning rate for one process's batch; the distributed labs scale it by the "
                            "world size (default 0.1; 0.025 with --smoke)")
    train.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (Nesterov)")
    train.add_argument("--weight-decay", type=float, default=5e-4, help="L2 penalty")
    train.add_argument("--warmup-epochs", type=float,
                       help="linear learning-rate warm-up before the cosine decay (default 2; 0.5 with --smoke)")
    train.add_argument("--stem", choices=["cifar", "standard"],
                       help="ResNet-18 input stem: cifar (3x3 conv, no max-pool: accurate on 32x32) or standard "
                            "(ImageNet's 7x7/2 conv + max-pool: about 16x cheaper, for CPUs); default cifar, "
                            "standard with --smoke")
    train.add_argument("--bn-eval", action="store_true",
                       help="BatchNorm keeps its running statistics fixed, so a sample's output does not depend on "
                            "its batch: runs with different per-process batches can be compared exactly")
    train.add_argument("--target-accuracy", type=float, help="report the time to reach this test accuracy (0-1)")

    device = parser.add_argument_group("device")
    device.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if visible")
    device.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                        help="autocast precision (auto: bf16 on GPUs that have it, else fp16; fp32 on CPU)")
    device.add_argument("--channels-last", action=argparse.BooleanOptionalAction,
                        help="NHWC memory layout (default: on for GPUs, whose tensor cores want it)")

    ckpt = parser.add_argument_group("checkpoint")
    ckpt.add_argument("--checkpoint", type=Path, help="write model and optimizer here after every epoch")
    ckpt.add_argument("--resume", action="store_true", help="start from --checkpoint and go on to --epochs")


def resolve_training_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the defaults the profile and the device decide, then refuse what cannot run.

    Everything is settled here, before the run starts, so the record's config shows what really ran.
    """
    profile = SMOKE if args.smoke else FULL
    for name, value in profile.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    full_train, full_test = CIFAR10_SIZES
    args.train_size = full_train if args.train_size is None else args.train_size
    args.test_size = full_test if args.test_size is None else args.test_size

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible; use --device cpu")
    if args.device == "auto":
        # The GPUs only when every rank on this node gets one of its own (host.rank_device): with
        # fewer GPUs than ranks the harness runs Gloo on the CPUs, and so does every rank here.
        topology = detect_topology()
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        args.device = rank_device("auto", topology.local_rank, topology.local_world_size, gpus).split(":")[0]
    on_gpu = args.device == "cuda"
    if args.precision == "auto":
        args.precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    if args.precision == "fp16" and not on_gpu:
        parser.error("--precision fp16 needs a GPU; use fp32 or bf16 on CPU")
    args.channels_last = on_gpu if args.channels_last is None else args.channels_last
    args.workers = (4 if on_gpu else 0) if args.workers is None else args.workers

    for name in ("train_size", "test_size", "epochs", "batch_size", "accumulate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.dataset == "cifar10" and (args.train_size > full_train or args.test_size > full_test):
        parser.error(f"CIFAR-10 has {full_train} training and {full_test} test images; lower --train-size/--test-size")
    if args.batch_size % args.accumulate:
        parser.error(f"--batch-size {args.batch_size} is not divisible by --accumulate {args.accumulate}; "
                     "each micro-batch must hold the same number of images")
    if not 0 <= args.synthetic_noise < 100:
        parser.error("--synthetic-noise must be a number from 0 (no noise) up, like the default 1.5")
    if args.workers < 0 or args.warmup_epochs < 0 or args.lr <= 0:
        parser.error("--workers and --warmup-epochs must be >= 0, --lr > 0")
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        parser.error("--target-accuracy is a fraction in (0, 1]")
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint PATH (the file to resume from)")


def steps_per_epoch(train_images: int, global_batch: int) -> int:
    """Optimizer steps in one epoch: whole global batches only (the remainder is dropped, see train_loader)."""
    steps = train_images // global_batch
    if steps == 0:
        raise SystemExit(f"error: {train_images} training images cannot fill one global batch of {global_batch} "
                         "(batch size x world size); raise --train-size or lower --batch-size or the world size")
    return steps


# ----------------------------------------------------------------------------------------------- data


class ImageSet(Dataset):
    """Images as one uint8 tensor in memory, fetched a batch at a time.

    A batch is (images, labels, indices): the indices let the distributed labs prove which samples
    each rank trained on. With augment, each batch gets a random crop and flip drawn from a
    generator seeded by the batch's own indices: the same batch always gets the same augmentation,
    in whichever worker process it is fetched and after a resume, and a new batch (every epoch
    reshuffles) gets new randomness.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: bool, seed: int = 0) -> None:
        self.images, self.labels, self.augment, self.seed = images, labels, augment, seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images, labels, indices = self.__getitems__([index])
        return images[0], labels[0], indices[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        images = self.images[index]
        if self.augment:
            images = augment(images, _batch_generator(self.seed, index))
        return images, self.labels[index], index


def _batch_generator(seed: int, index: torch.Tensor) -> torch.Generator:
    digest = hashlib.blake2b(index.numpy().tobytes(), digest_size=8, key=str(seed).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def keep_batch(batch: Any) -> Any:
    """collate_fn for ImageSet: its __getitems__ already returns a whole batch."""
    return batch


def random_crop(images: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """A size x size window of each image at a random offset (a loop of slices: cheaper than a gather)."""
    height, width = images.shape[-2:]
    tops = torch.randint(0, height - size + 1, (len(images),), generator=generator).tolist()
    lefts = torch.randint(0, width - size + 1, (len(images),), generator=generator).tolist()
    return torch.stack([image[:, top:top + size, left:left + size]
                        for image, top, left in zip(images, tops, lefts, strict=True)])


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard CIFAR augmentation: pad 4 pixels of black, crop back to the original size, flip half."""
    size = images.shape[-1]
    images = random_crop(F.pad(images, [CROP_PADDING] * 4), size, generator)
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def synthetic_cifar10(train_size: int, test_size: int, noise: float = SYNTHETIC_NOISE) -> tuple[torch.Tensor, ...]:
    """A learnable stand-in for CIFAR-10: same shape, 10 classes, the label decided by the image.

    Each class is a texture: a sum of SYNTHETIC_WAVES coloured plane waves, each with the class's
    own spatial frequency and orientation. A sample shows its class's waves at random phases and
    amplitudes under pixel noise (`noise`: the default is strong; less noise, an easier set, is what
    the CPU grade uses to learn in a minute). Random phases average any single pixel out, so a linear
    model on pixels is near chance; a network must learn oriented frequency detectors (what the
    first layers of a CNN do), and it takes a few epochs to.
    Returns train_images, train_labels, test_images, test_labels (uint8 NCHW, int64).
    """
    generator = torch.Generator().manual_seed(SYNTHETIC_SEED)
    cycles = 1.5 + 4.5 * torch.rand(CLASSES, SYNTHETIC_WAVES, generator=generator)  # per 32 pixels
    angle = math.pi * torch.rand(CLASSES, SYNTHETIC_WAVES, generator=generator)
    wave_x, wave_y = (2 * math.pi * cycles / IMAGE_SHAPE[-1] * trig(angle) for trig in (torch.cos, torch.sin))
    colour = F.normalize(torch.randn(CLASSES, SYNTHETIC_WAVES, 3, generator=generator), dim=-1)
    y, x = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, CLASSES, (count,), generator=generator)
        chunks = []
        for start in range(0, count, 4096):  # bounded memory whatever the size
            label = labels[start:start + 4096]
            shape = (len(label), SYNTHETIC_WAVES, 1, 1)
            phase = 2 * math.pi * torch.rand(shape, generator=generator)
            amplitude = 0.5 + torch.rand(shape, generator=generator)
            waves = amplitude * torch.cos(wave_x[label][..., None, None] * x + wave_y[label][..., None, None] * y
                                          + phase)
            pixels = torch.einsum("nwhv,nwc->nchv", waves, colour[label])
            pixels += noise * torch.randn(len(label), *IMAGE_SHAPE, generator=generator)
            chunks.append((128 + 40 * pixels).round().clamp(0, 255).to(torch.uint8))
        return torch.cat(chunks), labels

    train_images, train_labels = draw(train_size)
    test_images, test_labels = draw(test_size)
    return train_images, train_labels, test_images, test_labels


def cifar10_folder(data_dir: Path) -> Path:
    """The staged CIFAR-10 folder: DIR/cifar-10-batches-py (torchvision's layout) or DIR itself."""
    for folder in (data_dir / CIFAR10_FOLDER, data_dir):
        if (folder / CIFAR10_TEST_FILE).is_file():
            return folder
    raise SystemExit(
        f"error: CIFAR-10 is not staged in {data_dir}; fetch it once on a machine with internet with "
        f"`distlab data --data-dir {data_dir}`, or copy its {CIFAR10_FOLDER} folder there, or use --dataset synthetic")


def read_cifar10_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One file of CIFAR-10's python format: a pickled dict with 'data' (N x 3072 uint8) and 'labels'."""
    try:
        with open(path, "rb") as handle:
            # CIFAR-10's own format is a pickle, which can run code: read only files from a source you trust.
            batch = pickle.load(handle, encoding="latin1")
        data, labels = torch.as_tensor(batch["data"]), torch.as_tensor(batch["labels"], dtype=torch.long)
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as error:
        raise SystemExit(f"error: {path} is not a CIFAR-10 batch file ({type(error).__name__}: {error}); "
                         "fetch it again with `distlab data`") from None
    if (data.dtype != torch.uint8 or data.ndim != 2 or data.shape[1] != math.prod(IMAGE_SHAPE)
            or len(labels) != len(data) or labels.min() < 0 or labels.max() >= CLASSES):
        raise SystemExit(f"error: {path} does not hold N x 3072 uint8 images with labels 0-9; "
                         "fetch it again with `distlab data`")
    return data.view(-1, *IMAGE_SHAPE), labels


def read_cifar10(data_dir: Path) -> tuple[torch.Tensor, ...]:
    """All of a staged CIFAR-10: train_images, train_labels, test_images, test_labels."""
    folder = cifar10_folder(data_dir)
    missing = [name for name in CIFAR10_TRAIN_FILES if not (folder / name).is_file()]
    if missing:
        raise SystemExit(f"error: {folder} lacks {', '.join(missing)}; fetch CIFAR-10 again with "
                         f"`distlab data --data-dir {data_dir}`")
    train = [read_cifar10_batch(folder / name) for name in CIFAR10_TRAIN_FILES]
    test_images, test_labels = read_cifar10_batch(folder / CIFAR10_TEST_FILE)
    return torch.cat([i for i, _ in train]), torch.cat([la for _, la in train]), test_images, test_labels


def fetch_cifar10(data_dir: Path) -> Path:
    """Download CIFAR-10 into data_dir once (torchvision checks its checksum); returns the folder."""
    data_dir = Path(data_dir)
    try:
        for train in (True, False):
            torchvision.datasets.CIFAR10(root=str(data_dir), train=train, download=True)
    except (OSError, RuntimeError) as error:  # URLError is an OSError; a bad checksum is a RuntimeError
        raise SystemExit(f"error: could not download CIFAR-10 into {data_dir} ({error}); on a machine without "
                         f"internet copy {CIFAR10_FOLDER} from one that has it into {data_dir}") from None
    return data_dir / CIFAR10_FOLDER


def load_datasets(args: argparse.Namespace) -> tuple[ImageSet, ImageSet]:
    """The training set (augmented unless --no-augment) and the test set, cut to --train-size/--test-size."""
    if args.dataset == "cifar10":
        train_images, train_labels, test_images, test_labels = read_cifar10(args.data_dir)
    else:
        train_images, train_labels, test_images, test_labels = synthetic_cifar10(args.train_size, args.test_size,
                                                                                 args.synthetic_noise)
    return (ImageSet(train_images[:args.train_size], train_labels[:args.train_size], args.augment, args.seed),
            ImageSet(test_images[:args.test_size], test_labels[:args.test_size], augment=False))


class EpochShuffle(Sampler[int]):
    """A fresh permutation every epoch, decided by (seed, epoch) alone.

    It draws exactly the permutation torch's DistributedSampler draws with one replica, so a
    resumed run sees the same order it would have seen, and the distributed labs, whose ranks
    split this same permutation, see the same samples per step as the baseline.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())


def train_loader(dataset: ImageSet, sampler: Iterable[int], batch_size: int, args: argparse.Namespace) -> DataLoader:
    # drop_last: every step has a full batch, so each optimizer step sees the same number of images
    # (and, in the distributed labs, every rank runs the same number of steps: none waits at an
    # all-reduce for a rank that has already finished). Fewer than one batch per epoch goes unseen,
    # and a different few each epoch since the order is reshuffled.
    return _loader(dataset, sampler, batch_size, args, drop_last=True)


def test_loader(dataset: ImageSet, batch_size: int, args: argparse.Namespace,
                shard: Iterable[int] | None = None) -> DataLoader:
    return _loader(dataset, shard, batch_size, args, drop_last=False)


def _loader(dataset: ImageSet, sampler: Iterable[int] | None, batch_size: int, args: argparse.Namespace,
            drop_last: bool) -> DataLoader:
    on_gpu = args.device == "cuda"
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, collate_fn=keep_batch,
                      num_workers=args.workers,
                      pin_memory=on_gpu,  # page-locked host memory: the copy to the GPU runs asynchronously
                      persistent_workers=args.workers > 0)  # no new worker processes at every epoch


@functools.cache
def _normalisation(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: creating them at every batch would copy from host memory synchronously
    # and make the CPU wait for the GPU's queue each step.
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1) * 255
    return mean, std


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device,
              channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images to normalised floats on the device (converting there: 4x less to copy)."""
    images = images.to(device, non_blocking=True)
    mean, std = _normalisation(device)
    images = (images.float() - mean) / std
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=True)


# ---------------------------------------------------------------------------------------------- model


def build_model(stem: str) -> nn.Module:
    """torchvision's ResNet-18 for 10 classes, with the CIFAR stem or ImageNet's standard one."""
    model = torchvision.models.resnet18(num_classes=CLASSES)
    if stem == "cifar":
        # The standard stem (7x7 conv stride 2, then max-pool) shrinks a 32x32 image to 8x8 before the
        # first block: cheap, but it throws away most of the detail. A 3x3 conv with stride 1 and no
        # pool keeps 32x32, at about 16x the compute.
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision does
        model.maxpool = nn.Identity()
    return model


def model_tag(args: argparse.Namespace) -> str:
    """What a checkpoint must match to be loaded into this run's model."""
    return f"resnet18-{args.stem}-stem-{CLASSES}-classes"


def pick_device(args: argparse.Namespace, local_rank: int = 0) -> torch.device:
    """This process's device: GPU local_rank with --device cuda (the distributed labs then make it the
    current device themselves, torch.cuda.set_device), else the CPU. More ranks than GPUs, asked for
    with --device cuda, share them (host.rank_device): Gloo carries CUDA tensors between ranks on one GPU."""
    if args.device == "cuda":
        device = torch.device(rank_device("cuda", local_rank, 1, torch.cuda.device_count()))
        # cuDNN picks the fastest convolution algorithm for these fixed shapes on the first steps.
        torch.backends.cudnn.benchmark = True
        return device
    return torch.device("cpu")


def set_bn_eval(model: nn.Module, bn_eval: bool) -> None:
    """Put BatchNorm layers back in eval mode after model.train() when --bn-eval asks for it."""
    if bn_eval:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


@dataclass
class Precision:
    """Autocast and, for fp16 only, gradient scaling (bf16 has fp32's range and needs none)."""

    device: torch.device
    dtype: torch.dtype | None  # None: plain fp32
    scaler: torch.amp.GradScaler

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)


def make_precision(args: argparse.Namespace, device: torch.device) -> Precision:
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    return Precision(device, dtype, torch.amp.GradScaler(device.type, enabled=dtype == torch.float16))


def make_optimizer(model: nn.Module, lr: float, args: argparse.Namespace) -> torch.optim.Optimizer:
    # fused: one kernel for the whole update; on a CPU it takes 9 ms a step for ResNet-18 where the
    # default per-parameter loop takes 20 ms (measured, 1 thread), a tenth of a small batch's step.
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, nesterov=True,
                           weight_decay=args.weight_decay, fused=True)


def make_schedule(optimizer: torch.optim.Optimizer, steps_per_epoch: int, args: argparse.Namespace,
                  step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from a tenth of the peak, then cosine decay to zero; stepped once per optimizer step.

    step: optimizer steps already taken (by the run a checkpoint came from); schedule.last_epoch
    then goes on counting global steps.
    """
    total = steps_per_epoch * args.epochs
    warmup = round(args.warmup_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return 0.1 + 0.9 * step / warmup
        return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / max(1, total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=step - 1)


@torch.no_grad()
def count_correct(model: nn.Module, loader: DataLoader, precision: Precision, args: argparse.Namespace,
                  device: torch.device) -> torch.Tensor:
    """[correct, total] on this process's share of the test set, as a float64 tensor on the device."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for images, labels, _ in loader:
        images, labels = to_device(images, labels, device, args.channels_last)
        with precision.autocast():
            predicted = model(images).argmax(dim=1)
        counts[0] += (predicted == labels).sum()
        counts[1] += len(labels)
    return counts


# ------------------------------------------------------------------------------------- timing, history


class TrainClock:
    """Training-only throughput: images and seconds of training steps.

    Leaves out the first TIMING_WARMUP_STEPS steps of the run (start-up) and everything between
    epochs (evaluation, checkpoints). On a GPU it synchronises only where it reads the clock,
    so it does not stall the queue of kernels at every step.
    """

    def __init__(self, device: torch.device, skip: int = TIMING_WARMUP_STEPS) -> None:
        self.device, self.skip = device, skip
        self.steps = self.images = 0
        self.seconds = 0.0
        self.mark: float | None = None
        self.epoch_start = 0.0

    def _now(self) -> float:
        return timing.now(self.device)

    def start_epoch(self) -> None:
        self.epoch_start = self._now()
        self.mark = self.epoch_start if self.steps >= self.skip else None

    def step(self, images: int) -> None:
        self.steps += 1
        if self.steps == self.skip:
            self.mark = self._now()
        elif self.steps > self.skip:
            self.images += images

    def end_epoch(self) -> float:
        """Seconds the epoch's training took, start-up included."""
        now = self._now()
        if self.mark is not None:
            self.seconds += now - self.mark
        return now - self.epoch_start

    @property
    def img_per_sec(self) -> float | None:
        return self.images / self.seconds if self.seconds > 0 else None


@dataclass
class History:
    """Per-epoch results; kept in the checkpoint, so a resumed run reports the whole run."""

    train_loss: list[float]
    test_accuracy: list[float]
    epoch_seconds: list[float]
    elapsed_seconds: float = 0.0  # training + evaluation, summed over runs
    time_to_target_seconds: float | None = None

    @classmethod
    def empty(cls) -> History:
        return cls([], [], [])

    def add(self, loss: float, accuracy: float, epoch_seconds: float, elapsed: float,
            target: float | None) -> None:
        self.train_loss.append(loss)
        self.test_accuracy.append(accuracy)
        self.epoch_seconds.append(epoch_seconds)
        self.elapsed_seconds += elapsed
        if target is not None and accuracy >= target and self.time_to_target_seconds is None:
            self.time_to_target_seconds = self.elapsed_seconds


def report(record: Any, history: History, clock: TrainClock, args: argparse.Namespace, lr: float,
           global_batch: int, img_per_sec: float | None) -> None:
    """The metrics every training lab writes in its record."""
    record.metrics.update({
        "img_per_sec": img_per_sec,
        "epoch_seconds": history.epoch_seconds,
        "train_loss": history.train_loss,
        "test_accuracy": history.test_accuracy,
        "final_accuracy": history.test_accuracy[-1] if history.test_accuracy else None,
        "target_accuracy": args.target_accuracy,
        "time_to_target_seconds": history.time_to_target_seconds,
        "elapsed_seconds": history.elapsed_seconds,
        "timed_steps": max(0, clock.steps - clock.skip),
        "global_batch": global_batch,
        "peak_lr": lr,
    })


def epoch_line(epoch: int, args: argparse.Namespace, history: History) -> str:
    return (f"epoch {epoch + 1}/{args.epochs}: loss {history.train_loss[-1]:.4f}  "
            f"test accuracy {history.test_accuracy[-1]:.4f}  {history.epoch_seconds[-1]:.1f} s")


# ------------------------------------------------------------------------------------------ checkpoint


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, step: int,
                    history: History, args: argparse.Namespace, global_batch: int) -> None:
    """Write to a temporary file beside path, then rename: a crash mid-write leaves the previous checkpoint."""
    state = {
        "format": CHECKPOINT_FORMAT,
        "model_tag": model_tag(args),
        "global_batch": global_batch,
        "epoch": epoch,  # the next epoch to run
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": vars(history),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                    args: argparse.Namespace, global_batch: int) -> tuple[int, int, History]:
    """Load a checkpoint into model and optimizer; returns (next epoch, global step, history).

    map_location puts every tensor on this process's device: a checkpoint written from cuda:0
    would otherwise land on GPU 0 in every process. weights_only refuses pickled code.
    Anything unusable stops the run before it writes anything.
    """
    if not path.is_file():
        raise SystemExit(f"error: --resume: no checkpoint at {path}; drop --resume to start afresh")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise SystemExit(f"error: {path} is not a readable checkpoint ({type(error).__name__}); "
                         "delete it or point --checkpoint at another") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"error: {path} is not a distlab training checkpoint; point --checkpoint at one")
    if state["model_tag"] != model_tag(args):
        raise SystemExit(f"error: {path} holds a {state['model_tag']} model, this run builds {model_tag(args)}; "
                         "resume with the same --stem")
    if state["global_batch"] != global_batch:
        raise SystemExit(f"error: {path} was trained with a global batch of {state['global_batch']}, this run has "
                         f"{global_batch}; resume with the same --batch-size x world size")
    if state["epoch"] >= args.epochs:
        raise SystemExit(f"error: {path} has already trained {state['epoch']} epochs; raise --epochs to go on")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise SystemExit(f"error: {path} does not fit this model ({first_line}); point --checkpoint at another") \
            from None
    return state["epoch"], state["step"], History(**state["history"])
