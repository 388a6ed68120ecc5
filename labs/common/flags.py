"""The flags the three training labs share, with their two sets of defaults: FULL (the course's
ResNet-18 on CIFAR-10) and SMOKE (seconds on a CPU; the tests use it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from labs.common.data import CIFAR10_SIZES, SYNTHETIC_NOISE
from labs.common.host import rank_device
from labs.common.topology import detect_topology

DEFAULT_DATA_DIR = Path(os.environ.get("DISTLAB_DATA_DIR", "data"))
# Defaults a flag takes when it is not given. FULL trains the course's ResNet-18 on CIFAR-10;
# SMOKE runs in seconds on a CPU (tests use it). Flags given on the command line always win.
# SMOKE's learning rate is FULL's scaled to its smaller batch (0.1 per 128 images).
FULL = {"dataset": "cifar10", "train_size": None, "test_size": None, "epochs": 30, "batch_size": 128, "lr": 0.1,
        "stem": "cifar", "warmup_epochs": 2.0}
SMOKE = {"dataset": "synthetic", "train_size": 256, "test_size": 128, "epochs": 2, "batch_size": 32, "lr": 0.025,
         "stem": "standard", "warmup_epochs": 0.5}


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
