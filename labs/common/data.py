"""The training labs' data: CIFAR-10 in its own pickle format (fetched once by `distlab data`, or staged
by hand), or a synthetic set of the same shape whose labels really depend on the images, so accuracy
means something offline; and the loaders over them.

Images stay in memory as uint8; the training set is augmented a batch at a time (random crop with 4
pixels of padding, horizontal flip) and normalised on the device (models.to_device).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import pickle
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset, Sampler

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
