"""How many cores are ours (labs/common/host.py, usable_cores): the CPU affinity, then the cgroup's CPU
quota (v2 cpu.max, v1 cpu.cfs_quota_us over cpu.cfs_period_us, the smallest up the tree), then the host.

The cgroup layouts are folders laid out like /sys/fs/cgroup with a /proc/self/cgroup beside them;
taskset and, as root, a real cgroup with a quota show the same answer from a live process, and the
harness's own choices (threads per rank, mpirun's --oversubscribe, run.json) follow it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.observe import accuracy
from harness.verdict.evaluate import evaluate_across, evaluate_cell
from harness.verdict.expectations import Band, LabExpectation
from harness.verdict.speed import NOT_COMPARABLE, speed_not_judged, unjudged
from harness.verdict.verdicts import Sample
from labs.common.host import (
    Cores,
    cgroup_cpu_quota,
    cpu_quota_settings,
    own_memory_limit,
    tightest_memory_limit,
    usable_cores,
)

ROOT = Path(__file__).resolve().parent.parent
ASK = ("import json, dataclasses; from labs.common.host import usable_cores; "
       "print(json.dumps(dataclasses.asdict(usable_cores())))")


def hierarchy(tmp_path: Path, proc_lines: list[str], files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /sys/fs/cgroup (files: path under it -> content) and the /proc/self/cgroup naming our cgroup."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("".join(line + "\n" for line in proc_lines))
    return root, proc


def test_v2_cpu_max_of_a_kubernetes_pod(tmp_path):
    # A pod with `limits: cpu: 1500m`: the kubelet writes the pod's cpu.max; its container has none.
    root, proc = hierarchy(tmp_path, ["0::/kubepods.slice/pod1/ctr"], {
        "kubepods.slice/cpu.max": "max 100000\n",
        "kubepods.slice/pod1/cpu.max": "150000 100000\n",
        "kubepods.slice/pod1/ctr/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(root, proc) == ("cgroup cpu.max", 1.5)
    cores = usable_cores(root, proc)
    assert cores.quota == 1.5 and cores.count == 1  # rounded down: 1.5 cores run one thread at full speed
    assert cores.limited_by == ("cgroup cpu.max" if cores.host > 1 else "host")


def test_v1_cfs_quota_of_a_slurm_job(tmp_path):
    # Hybrid host: the cpu controller on v1 (this machine's layout), the unified tree beside it.
    root, proc = hierarchy(tmp_path, ["12:pids:/", "4:cpu,cpuacct:/slurm/uid_0/job_7", "0::/"], {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/slurm/uid_0/job_7/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/slurm/uid_0/job_7/cpu.cfs_period_us": "100000\n",
        "cpu.max": "50000 100000\n"})  # the unified tree holds no cpu controller here: never read
    assert cgroup_cpu_quota(root, proc) == ("cgroup cpu.cfs_quota_us", 3.0)


def test_a_parent_s_smaller_quota_binds_its_children(tmp_path):
    root, proc = hierarchy(tmp_path, ["1:cpu:/job/step"], {
        "cpu/job/cpu.cfs_quota_us": "100000\n", "cpu/job/cpu.cfs_period_us": "100000\n",
        "cpu/job/step/cpu.cfs_quota_us": "400000\n", "cpu/job/step/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(root, proc)[1] == 1.0
    root2, proc2 = hierarchy(tmp_path / "v2", ["0::/a/b"], {"a/cpu.max": "100000 50000\n",
                                                           "a/b/cpu.max": "50000 100000\n"})
    assert cgroup_cpu_quota(root2, proc2)[1] == 0.5
    assert usable_cores(root2, proc2).count == 1  # never fewer than one


def test_a_container_that_sees_only_its_own_cgroup_reads_the_mount_s_root(tmp_path):
    # Without a cgroup namespace /proc/self/cgroup names the host's path, and the container's mount
    # holds its own cgroup at the root.
    root, proc = hierarchy(tmp_path, ["0::/machine.slice/libpod-4f2a.scope"], {"cpu.max": "200000 100000\n"})
    assert cgroup_cpu_quota(root, proc) == ("cgroup cpu.max", 2.0)


@pytest.mark.parametrize(("proc_lines", "files"), [
    (["0::/user.slice"], {"user.slice/cpu.max": "max 100000\n", "cpu.max": "max 100000\n"}),
    (["3:cpu,cpuacct:/"], {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}),
    (["0::/"], {}),  # cpu.max absent (the root cgroup has none)
    (["3:cpu,cpuacct:/"], {}),  # no v1 cpu hierarchy mounted
], ids=["v2-max", "v1-minus-one", "v2-no-file", "v1-no-mount"])
def test_no_quota_leaves_affinity_and_the_host(tmp_path, proc_lines, files):
    root, proc = hierarchy(tmp_path, proc_lines, files)
    assert cgroup_cpu_quota(root, proc)[1] is None
    cores = usable_cores(root, proc)
    assert cores.quota is None
    assert cores.count == len(os.sched_getaffinity(0)) <= (os.cpu_count() or 1)


def test_no_proc_self_cgroup_is_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path, tmp_path / "absent") == ("", None)


def test_the_tightest_memory_limit_is_the_least_on_the_way_up(tmp_path):
    # A class job's own group (8 GiB) inside a container of 2 GiB: the container's binds (v1, a host's path).
    root, proc = hierarchy(tmp_path, ["4:memory:/box/job", "0::/"], {
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/box/memory.limit_in_bytes": f"{2 << 30}\n",
        "memory/box/job/memory.limit_in_bytes": f"{8 << 30}\n"})
    assert tightest_memory_limit(root, proc) == 2 << 30
    assert own_memory_limit(root, proc) == 8 << 30  # the job's own group's (read under the memory hierarchy)
    root2, proc2 = hierarchy(tmp_path / "v2", ["0::/a/b"], {"a/memory.max": f"{3 << 30}\n", "a/b/memory.max": "max\n"})
    assert tightest_memory_limit(root2, proc2) == 3 << 30
    root3, proc3 = hierarchy(tmp_path / "none", ["0::/"], {"memory.max": "max\n"})
    assert tightest_memory_limit(root3, proc3) is None


@pytest.mark.parametrize("version", [1, 2])
def test_a_quota_written_is_the_quota_read_back(tmp_path, version):
    """cpu_quota_settings (a benchmark's box) writes what cgroup_cpu_quota reads: half a CPU is half a CPU."""
    folder = "cpu/box" if version == 1 else "box"
    files = {f"{folder}/{name}": value for name, value in cpu_quota_settings(0.5, version).items()}
    root, proc = hierarchy(tmp_path, ["1:cpu:/box"] if version == 1 else ["0::/box"], files)
    assert cgroup_cpu_quota(root, proc)[1] == 0.5


def test_the_evaluator_waits_beside_the_runs_only_where_memory_allows():
    """Measured (accuracy.KEEP_WARM_BYTES): kept warm, a two-rank grade needed 2.5 GB; ended after each
    answer, 2 GB and 1.5 GB held. No limit: warm."""
    assert accuracy.keeps_warm(3 << 30) and accuracy.keeps_warm(accuracy.KEEP_WARM_BYTES)
    assert not accuracy.keeps_warm(2 << 30) and not accuracy.keeps_warm(768 << 20)
    assert accuracy.Evaluator(warm=False).warm is False and accuracy.Evaluator(warm=True).warm is True


def test_the_fewest_names_the_limit():
    assert usable_cores().count <= (os.cpu_count() or 1)
    assert Cores(2, "affinity", 8, 2, None).describe() == "2 of the host's 8 cores (affinity)"
    assert Cores(1, "cgroup cpu.max", 8, 8, 1.5).describe() == \
        "1 of the host's 8 cores (cgroup cpu.max: 1.5 cores of quota)"
    assert Cores(8, "host", 8, 8, None).describe() == "8 cores (the host's)"


def _asked(prefix: list[str], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([*prefix, sys.executable, "-c", ASK], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin to 1 of them")


@needs_two_cores
def test_taskset_is_one_core():
    if not shutil.which("taskset"):
        pytest.skip("taskset (util-linux) is not installed")
    cores = _asked(["taskset", "-c", str(min(os.sched_getaffinity(0)))])
    assert (cores["count"], cores["limited_by"], cores["affinity"]) == (1, "affinity", 1)
    assert cores["host"] == os.cpu_count()


@pytest.fixture
def quota_cgroup():
    """A real cgroup with half a core of quota, on whichever layout holds the cpu controller; its
    cgroup.procs file, where a process writes itself to enter it. Removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    name = f"distlab-test-{uuid.uuid4().hex[:8]}"
    v1, unified = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    controllers = unified / "cgroup.controllers"
    if (v1 / "cpu.cfs_quota_us").exists():
        folder, writes = v1 / name, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"}
    elif controllers.exists() and "cpu" in controllers.read_text().split():
        folder, writes = unified / name, {"cpu.max": "50000 100000"}
    else:
        pytest.skip("no cgroup hierarchy with the cpu controller is mounted")
    try:
        folder.mkdir()
        for file, value in writes.items():
            (folder / file).write_text(value)
    except OSError as error:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(f"cannot make a cgroup with a quota here: {error}")
    try:
        yield folder / "cgroup.procs"
    finally:
        folder.rmdir()  # empty again: the test's process has ended


def test_a_real_cgroup_quota_is_one_core(quota_cgroup):
    cores = _asked(["sh", "-c", f'echo $$ > {quota_cgroup} && exec "$@"', "sh"])
    assert cores["quota"] == 0.5 and cores["count"] == 1
    if cores["affinity"] > 1:
        assert cores["limited_by"].startswith("cgroup cpu.")


@pytest.mark.integration
@needs_two_cores
def test_distlab_run_under_taskset_sizes_threads_and_mpirun_for_one_core(tmp_path):
    """Red before usable_cores: one rank got the host's 2 cores' worth of threads, and mpirun's 2
    ranks on the one core got no --oversubscribe and no mpi_yield_when_idle (idle ranks busy-poll
    the core the working rank needs)."""
    if not shutil.which("taskset"):
        pytest.skip("taskset (util-linux) is not installed")
    distlab = Path(sys.executable).parent / "distlab"

    def dry_run(*argv: str) -> str:
        done = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), str(distlab), "run", *argv,
                               "--dry-run", "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        if done.returncode == 2 and "is not installed" in done.stderr:
            pytest.skip(done.stderr.strip())
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "OMP_NUM_THREADS=1 " in dry_run("check", "-n", "1")
    mpirun = dry_run("check", "-n", "2", "--launcher", "mpirun", "--backend", "mpi")
    assert "--oversubscribe" in mpirun and "mpi_yield_when_idle 1" in mpirun


# --- No speed verdict where the cores cannot support one (harness/verdict/speed.py) ------------------

def cpu(ranks: int, threads: int, cores: int, others: float | None = 0.0, cpus: int | None = None) -> dict:
    """What run/accounting.py cpu_account writes into run.json for a run."""
    return {"ranks_here": ranks, "threads_per_rank": threads, "cores": cores, "cores_limited_by": "affinity",
            "host_cores": 8, "cpus": cpus or cores, "cgroup_quota": None, "others_cores": others}


def run_sample(cpu_facts: dict | None, img_per_sec: float = 50.0, reference: float = 100.0) -> Sample:
    record = {"metrics": {"img_per_sec": img_per_sec, "final_accuracy": 0.95},
              "checks": {"shards_disjoint": {"passed": True}}}
    return Sample("run", "ok", None, 10.0, record, reference=reference, cpu=cpu_facts)


DDP = LabExpectation("ddp", (1, 2), time_budget_s=60, required_checks=("shards_disjoint",),
                     accuracy_delta=0.05, efficiency_min={2: 0.5}, reference="train_loop",
                     bands=(Band("img_per_sec", at_least_ratio={1: 0.6, 2: 0.6}), Band("final_accuracy", min=0.9)))


@pytest.mark.parametrize(("facts", "why"), [
    (cpu(2, 2, 2), "2 rank(s) x 2 thread(s) on 2 core(s)"),  # the sweep's condition 4
    (cpu(4, 1, 2), "4 rank(s) x 1 thread(s) on 2 core(s)"),  # make grade's ddp at 4 on two cores
    (cpu(1, 2, 2, others=1.0), "while other processes kept 1.00 of them busy"),  # condition 2: two busy beside
])
def test_speed_is_not_judged_where_the_cores_could_not_hold_the_threads(facts, why):
    # A ratio of 0.5 against a floor of 0.6 would fail: it is neither passed nor failed, and says why.
    verdicts = {v.check: v for v in evaluate_cell(DDP, 2, [run_sample(facts)], reference=100.0)}
    speed = verdicts["img_per_sec_ratio"]
    assert (speed.measured, speed.passed, speed.margin) == (NOT_COMPARABLE, None, None)
    assert why in speed.detail and "measured 0.500" in speed.detail
    # Correctness still counts: the run, the checks, the accuracy band. The time budget is a speed too.
    assert verdicts["check:shards_disjoint"].passed and verdicts["final_accuracy"].passed
    # The time budget is a speed row too, and a run within it passes whatever ran beside it (other
    # work only slows a run); over it, below, a crowded run is not comparable.
    assert verdicts["run"].passed and verdicts["time"].passed is True
    failing = run_sample(facts)
    failing.record["checks"]["shards_disjoint"]["passed"] = False
    assert not {v.check: v for v in evaluate_cell(DDP, 2, [failing], 100.0)}["check:shards_disjoint"].passed
    why = speed.detail.removeprefix("not comparable: ").split("; measured")[0]
    assert list(unjudged(list(verdicts.values()))) == [why]


@pytest.mark.parametrize("facts", [
    cpu(2, 1, 2),  # the shipped profiles: one thread per rank, as many ranks as cores
    cpu(1, 2, 2, others=0.3),  # a quiet machine's own work
    cpu(2, 2, 4, others=1.4, cpus=8),  # a quota of 4 on a big host whose other tenants use other CPUs
    None,  # a run from before the harness counted (the replay fixture's)
], ids=["one-thread", "quiet", "quota-on-a-big-host", "not-counted"])
def test_speed_is_judged_where_the_cores_held_the_threads(facts):
    runs = [run_sample(facts, img_per_sec=rate) for rate in (49.0, 50.0, 51.0)]  # three pairs, tight
    speed = {v.check: v for v in evaluate_cell(DDP, 2, runs, reference=100.0)}["img_per_sec_ratio"]
    assert speed.passed is False and speed.measured == "0.500"  # judged: and 0.5 is under the floor of 0.6


def test_a_lab_below_its_plain_loop_floor_beside_busy_programs_is_not_comparable():
    """Issue 48: coupled ranks beside other work are slowed more than an independent plain loop, so a
    ratio below the profile's floor measured on busy cores is not the lab's: not comparable, never
    failed, even when its interval is tight. On the same cores alone it fails."""
    busy = [run_sample(cpu(2, 1, 2, others=1.6), img_per_sec=rate) for rate in (49.0, 50.0, 51.0)]
    speed = {v.check: v for v in evaluate_cell(DDP, 2, busy, reference=100.0)}["img_per_sec_ratio"]
    assert (speed.measured, speed.passed) == (NOT_COMPARABLE, None)
    assert "others kept 1.60 of 2 core(s) busy" in speed.detail and "quieter machine" in speed.detail


def test_the_time_budget_is_a_speed_row_too():
    """A run over its budget beside two busy programs (the sweep's condition 2, horovod at 2 ranks:
    337 s against 148 s while the machine's load average rose past 200) is not judged; a run that
    timed out still fails its run row; over the budget on cores of its own, it fails."""
    slow = run_sample(cpu(1, 2, 2, others=1.6))
    slow.wall_seconds = 300.0
    verdicts = {v.check: v for v in evaluate_cell(DDP, 2, [slow], 100.0)}
    assert verdicts["time"].passed is None and "300.0 s" in verdicts["time"].detail
    hung = Sample("run", "failed", "timed out after 296 s: hang suspected", 300.0, None, cpu=cpu(1, 2, 2, others=1.6))
    verdicts = {v.check: v for v in evaluate_cell(DDP, 2, [hung], 100.0)}
    assert verdicts["run"].passed is False and verdicts["time"].passed is None
    alone = run_sample(cpu(1, 2, 2, others=0.1))
    alone.wall_seconds = 300.0
    assert {v.check: v for v in evaluate_cell(DDP, 2, [alone], 100.0)}["time"].passed is False
    beside = run_sample(cpu(1, 2, 2, others=1.6))
    beside.wall_seconds = 30.0  # within the budget beside busy programs: other work only ever slows a run
    assert {v.check: v for v in evaluate_cell(DDP, 2, [beside], 100.0)}["time"].passed is True


def test_efficiency_is_not_judged_where_either_end_was_crowded():
    base = [run_sample(cpu(1, 1, 2), img_per_sec=100.0)]
    cells = {1: base, 2: [run_sample(cpu(2, 2, 2), img_per_sec=60.0)]}
    (accuracy, efficiency) = evaluate_across(DDP, cells)
    assert accuracy.check == "accuracy_vs_ws1" and accuracy.passed  # correctness across world sizes counts
    assert efficiency.measured == NOT_COMPARABLE and efficiency.passed is None and "oversubscribed" in efficiency.detail
    crowded_base = {1: [run_sample(cpu(1, 2, 2, others=1.2), img_per_sec=100.0)],
                    2: [run_sample(cpu(2, 1, 2), img_per_sec=60.0)]}
    assert evaluate_across(DDP, crowded_base)[1].passed is None
    idle = {1: [run_sample(cpu(1, 1, 2), img_per_sec=rate) for rate in (99.0, 100.0, 101.0)],
            2: [run_sample(cpu(2, 1, 2), img_per_sec=rate) for rate in (59.0, 60.0, 61.0)]}
    assert evaluate_across(DDP, idle)[1].passed is False  # 0.3 < 0.5: judged, and failed
    one_each = {1: [run_sample(cpu(1, 1, 2), img_per_sec=100.0)], 2: [run_sample(cpu(2, 1, 2), img_per_sec=60.0)]}
    assert evaluate_across(DDP, one_each)[1].measured == NOT_COMPARABLE  # one run each: no spread, no verdict


@pytest.mark.integration
def test_a_run_records_its_cores_and_what_others_used_of_them(tmp_path):
    """A real run under taskset with two threads on one core, and one beside two busy processes on
    its cores: run.json holds the harness's count and measurement, and the speed is not judged."""
    if not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and 2 CPUs")
    distlab = str(Path(sys.executable).parent / "distlab")
    first = min(os.sched_getaffinity(0))
    done = subprocess.run(["taskset", "-c", str(first), distlab, "run", "check", "-n", "1", "--threads", "2",
                           "--results", str(tmp_path / "pinned"), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_json,) = (tmp_path / "pinned").glob("check/*/run.json")
    facts = json.loads(run_json.read_text())["cpu"]
    assert (facts["ranks_here"], facts["threads_per_rank"], facts["cores"], facts["cores_limited_by"]) == \
        (1, 2, 1, "affinity")
    assert json.loads(run_json.read_text())["oversubscribed"] is True
    assert "oversubscribed its cores" in speed_not_judged([Sample("r", "ok", None, 1.0, None, cpu=facts)])

    pair = sorted(os.sched_getaffinity(0))[:2]
    busy = [subprocess.Popen(["taskset", "-c", str(n), sys.executable, "-c", "while True: pass"]) for n in pair]
    try:
        done = subprocess.run(["taskset", "-c", ",".join(map(str, pair)), distlab, "run", "check", "-n", "1",
                               "--threads", "2", "--results", str(tmp_path / "busy")], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_json,) = (tmp_path / "busy").glob("check/*/run.json")
    facts = json.loads(run_json.read_text())["cpu"]
    assert facts["cores"] == 2 and facts["others_cores"] > 0.5, facts  # two busy loops on the run's 2 CPUs
    assert facts["run_queue"] >= 2 and facts["steal_cores"] is not None, facts  # the two loops were runnable
    assert "other processes kept" in speed_not_judged([Sample("r", "ok", None, 1.0, None, cpu=facts)])


def test_a_grade_says_which_speed_rows_it_did_not_judge_and_passes_on_correctness(tmp_path, capsys, monkeypatch):
    """A grade over runs that oversubscribed their cores: the throughput row is not judged (a ratio
    of 0.1 against a floor of 0.547 would fail), the grade passes on what it could judge, and its
    last lines say which row and why."""
    from harness.commands import grade
    from harness.grading.judge import run_grade
    from harness.grading.plan import plan_grade
    from harness.verdict.profiles import resolve

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def execute(grade_plan, done, references):
        assert grade_plan.cells() == [("baseline", 1)]
        references["baseline", 1] = [Sample("ref", "ok", None, 1.0, {"metrics": {"img_per_sec": 100.0}})]
        record = {"metrics": {"img_per_sec": 10.0, "final_accuracy": 0.95}, "checks": {}}
        done["baseline", 1] = [Sample("lab", "ok", None, 1.0, record, cpu=cpu(1, 2, 1))]

    plan = plan_grade(resolve("cpu-smoke", {}), labs=["baseline"], world_sizes=[1], results_root=tmp_path)
    assert grade.report(run_grade(plan, execute_cells=execute)) == 0
    out = capsys.readouterr().out
    assert "speed not comparable (baseline ws=1 img_per_sec_ratio): 1 rank(s) x 2 thread(s) on 1 " \
           "core(s)" in out
    (verdicts,) = tmp_path.glob("grade/*/verdicts.json")
    speed = next(v for v in json.loads(verdicts.read_text()) if v["check"] == "img_per_sec_ratio")
    assert (speed["measured"], speed["passed"]) == (NOT_COMPARABLE, None) and "measured 0.100" in speed["detail"]
