"""The class-grading GPU pool, checked on a CPU by reading the bubblewrap command it builds.

Inside the sandbox only the job's /dev/nvidiaN are bound, and CUDA numbers the devices it can open
from 0: a job given host GPUs 2 and 3 sees them as 0 and 1. CUDA_VISIBLE_DEVICES=2,3 inside (what
the pool set) named devices that do not exist there, so every slot but the first saw no GPU. The
driver's device minor of a GPU need not be its index either: the minors come from
/proc/driver/nvidia/gpus (faked here), in PCI bus order, the order CUDA_DEVICE_ORDER=PCI_BUS_ID
gives both outside and inside. And NCCL reads the PCI tree under /sys to learn the topology: those
paths are bound, with parents the job's uid can pass.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.classgrade.sandbox import bubblewrap
from harness.classgrade.sandbox.bubblewrap import available, bwrap_argv, bwrap_path, gpu_minors
from harness.classgrade.sandbox.spec import Spec, base_read_only
from harness.classgrade.sandbox.uid import FIRST_UID


def fake_driver(folder: Path, minors_by_bus: dict[str, int]) -> Path:
    for bus, minor in minors_by_bus.items():
        (folder / bus).mkdir(parents=True)
        (folder / bus / "information").write_text(f"Model: \t\t NVIDIA H200\nIRQ: \t\t 35\nDevice Minor: \t {minor}\n"
                                                  "Bus Location: \t " + bus + "\n")
    return folder


def values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == option]


def setenv(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i in range(len(argv) - 2) if argv[i] == "--setenv"}


def test_a_job_sees_its_own_gpus_numbered_from_zero_and_only_those(tmp_path, monkeypatch):
    # Four GPUs whose minors are not their bus order (the driver numbers them as it probes them).
    driver = fake_driver(tmp_path / "gpus", {"0000:1b:00.0": 2, "0000:3d:00.0": 0, "0000:9a:00.0": 3,
                                             "0000:ca:00.0": 1})
    monkeypatch.setattr(bubblewrap, "NVIDIA_GPUS", str(driver), raising=False)
    spec = Spec(uid=FIRST_UID, limits={}, read_only=[], hidden=[], gpus=[2, 3])
    argv = bwrap_argv(spec, str(tmp_path / "run"), ["true"])
    gpus = [path for path in values(argv, "--dev-bind-try") if path[len("/dev/nvidia"):].isdigit()]
    assert gpus == ["/dev/nvidia3", "/dev/nvidia1"]  # the third and fourth GPU on the bus, no other
    env = setenv(argv)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(values(argv, "--dev-bind-try"))


def test_without_the_drivers_word_the_minor_is_the_index(tmp_path, monkeypatch):
    monkeypatch.setattr(bubblewrap, "NVIDIA_GPUS", str(tmp_path / "no-driver"), raising=False)
    assert gpu_minors([4, 5]) == [4, 5]
    spec = Spec(uid=FIRST_UID, limits={}, read_only=[], hidden=[], gpus=[4, 5])
    assert setenv(bwrap_argv(spec, str(tmp_path / "run"), ["true"]))["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_cpu_job_binds_no_gpu_and_sets_no_cuda_variable(tmp_path):
    spec = Spec(uid=FIRST_UID, limits={}, read_only=[], hidden=[])
    argv = bwrap_argv(spec, str(tmp_path / "run"), ["true"])
    assert not [path for path in values(argv, "--dev-bind-try") if "nvidia" in path]
    assert "CUDA_VISIBLE_DEVICES" not in setenv(argv)
    assert "/sys/class/pci_bus" not in values(argv, "--ro-bind")


def made_before(argv: list[str], parent: str, child: str) -> bool:
    """`--perms 0755 --dir parent` comes before `--ro-bind child`: bwrap would make a missing parent
    mode 0700, closed to the job's uid."""
    made = [i for i in range(len(argv) - 3) if argv[i:i + 4] == ["--perms", "0755", "--dir", parent]]
    bound = [i for i in range(len(argv) - 1) if argv[i] == "--ro-bind" and argv[i + 1] == child]
    return bool(made and bound) and made[0] < bound[0]


@pytest.mark.skipif(not os.path.isdir("/sys/class/pci_bus"), reason="this host shows no PCI bus in /sys")
def test_the_sys_paths_nccl_reads_are_bound_with_parents_the_job_can_pass(tmp_path):
    spec = Spec(uid=FIRST_UID, limits={}, read_only=[], hidden=[], gpus=[0])
    argv = bwrap_argv(spec, str(tmp_path / "run"), ["true"])
    roots = [str(p) for p in Path("/sys/devices").glob("pci*")]
    assert roots and {"/sys/class/pci_bus", "/sys/bus/pci", *roots} <= set(values(argv, "--ro-bind"))
    assert made_before(argv, "/sys/class", "/sys/class/pci_bus") and made_before(argv, "/sys/bus", "/sys/bus/pci")


@pytest.mark.skipif(not os.path.isdir("/sys/class/pci_bus") or os.geteuid() != 0 or available() is not None,
                    reason="needs root, bubblewrap and a PCI bus in /sys")
def test_inside_the_sandbox_the_job_resolves_a_pci_path_as_nccl_does(tmp_path):
    """NCCL's path: realpath of /sys/class/pci_bus/<domain:bus>/../../<bus id>, then its attributes,
    read as the job's uid in a real sandbox."""
    bus = sorted(os.listdir("/sys/class/pci_bus"))[0]
    device = next(p.name for p in sorted(Path("/sys/bus/pci/devices").iterdir()) if p.name.startswith(bus))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, FIRST_UID, FIRST_UID)
    spec = Spec(uid=FIRST_UID, limits={}, read_only=base_read_only(), hidden=[], gpus=[0])
    probe = (f'p=$(realpath /sys/class/pci_bus/{bus}/../../{device}) && cat "$p/class" && '
             'echo "$CUDA_VISIBLE_DEVICES"')
    argv = bwrap_argv(spec, str(run_dir), ["sh", "-c", probe], tool=bwrap_path())
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    device_class, visible = done.stdout.split()
    assert device_class == Path(f"/sys/bus/pci/devices/{device}/class").read_text().strip() and visible == "0"
