"""What the harness's observer saw on every rank of a run, read back, and the run's training timed.

The observer (harness/on_ranks/observer) sits in every rank and writes what torch itself did there:
the process group, every sample index the data loaders handed out, the optimizer steps, every
torch.save and the final state of the trained model. This module reads it (`load`) and times the
run's training from it (`throughput`); data_parallel.py judges the run from it.

No torch here: the grader reads JSON only (harness/observe/accuracy.py loads the weights, in a subprocess).
Everything in the observe directory was written where the program runs, so it is read as the
program's own output: each file through harness/files.py (a regular file, never through a link,
bounded), each rank's file checked against harness/schemas/observations.schema.json (the format's
one definition; the file names are the observer's fileformat.py). A file that breaks either is a
problem of the run, never a crash of the grader. Each loader pass a rank file records is held against
the line its process streamed on stderr when the pass ended, which the harness kept from the
launcher's output as it arrived (fileformat.PASS_NOTES_FILE, written by the harness once the run had
ended): `verify_passes`.

Throughput, timed by the harness (`throughput`): on each rank, the images of the training batches
received after the run's first WARMUP_STEPS optimizer steps, over the time the training passes took
from then (the first epoch from the end of step WARMUP_STEPS, each later one from its first draw
from the loader) to their last step; the run's rate is the sum of the ranks' rates. This is the
labs' own TrainClock rule (labs/common/timing.py), measured from outside: the grade uses it, and a
record claiming much more is a contradicted claim (compare_claims).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from harness import files, schema_check
from harness.on_ranks.observer.distlab_observer.digests import pass_digest
from harness.on_ranks.observer.distlab_observer.fileformat import (
    ERRORS_FILES,
    PASS_NOTES_FILE,
    RANK_FILES,
    SPAWN_FILES,
    STOPPED_DIR,
    WEIGHTS_FILE,
    parse_pass_line,
)
from harness.on_ranks.observer.distlab_observer.fileformat import SCHEMA as OBSERVATIONS_SCHEMA

WARMUP_STEPS = 3  # the first optimizer steps of a run, left out of its throughput (start-up)
RANK_FILE_LIMIT = 64 << 20  # bytes of one rank's file: a CIFAR-10 run's indices over 100 epochs are ~30 MB
ERRORS_FILE_LIMIT = 4096  # of an observer error file, read for its first line
PASS_NOTES_LIMIT = 4 << 20  # bytes of the harness's PASS_NOTES_FILE: PASS_LINES_KEPT lines of some 100 bytes


@dataclass(frozen=True)
class LoaderPass:
    loader: int
    dataset_len: int | None
    sampler: str
    batches: int
    steps: int
    batch_sizes: list[int]
    indices: list[int]
    started: float | None = None  # the rank's perf_counter when the pass first drew from its loader
    step_times: list[float] = field(default_factory=list)  # when each optimizer step of the pass ended
    step_images: list[int] = field(default_factory=list)  # images the pass had handed out by each step
    steps_before: int | None = None  # optimizer steps the rank had taken when the pass began (None: version 1)
    # The trained model's forwards during the pass and the autocast dtypes they ran under (version 3,
    # where the observer counted them: distlab_observer/libraries.py); None: not known.
    forwards: int | None = None
    autocast: tuple[str, ...] = ()
    # Of those, the ones with gradients on given a tensor, and how many of them were given more samples
    # than the batch the loop had just received held; the largest such, beside that batch's most.
    samples: dict[str, int] = field(default_factory=dict)


@dataclass
class RankObservation:
    rank: int
    process_groups: list[dict[str, Any]]
    optimizer_steps: int
    passes: list[LoaderPass]
    saves: list[dict[str, Any]]
    model: dict[str, Any] | None
    errors: list[str]
    stopped: dict[str, Any] | None = None  # a resume cell's stop of this attempt (hooks.py)
    loads: list[dict[str, Any]] = field(default_factory=list)  # every torch.load of a file (version 2)
    libraries: dict[str, Any] = field(default_factory=dict)  # what it saw of the libraries (version 3)
    # The parameters' digests before the first step, after sampled steps and at exit, and the process's
    # age on the observer's clock and the kernel's (output.py, _training_evidence); None: not taken.
    training: dict[str, Any] | None = None
    # Why its pass records cannot be taken as observed (`verify_passes`: a pass changed after its line was
    # streamed, or no line came for it); None: each matched its line, or no lines were collected at all.
    passes_unverified: str | None = None
    # When the rank reached each milestone of fileformat.TIMELINE, on the host's CLOCK_MONOTONIC (observe/timeline.py);
    # empty where its observer did not stamp them.
    timeline: dict[str, float] = field(default_factory=dict)

    @property
    def training_epochs(self) -> list[LoaderPass]:
        return [p for p in self.passes if p.steps > 0]

    @property
    def evaluations_after_training(self) -> list[LoaderPass]:
        """Passes without an optimizer step in which the rank evaluated the model training had made.

        Where the observer counted the trained model's forwards, those that ran it after the rank's
        first training pass; else those after its last training pass. A pass that ran no forward
        evaluated nothing: the DDP tutorial takes one batch from its training loader at the top of
        each epoch to print its size (`len(next(iter(train_data))[0])`), a pass of one batch and no
        step between two training passes."""
        training = [i for i, p in enumerate(self.passes) if p.steps > 0]
        if not training:
            return []
        if self.forwards_counted:
            return [p for p in self.passes[training[0] + 1:] if p.steps == 0 and p.forwards]
        return [p for p in self.passes[training[-1] + 1:] if p.steps == 0]

    @property
    def forwards_counted(self) -> bool:
        """Whether the observer counted the model's forwards here: it did (version 3, no torch.compile
        first) and saw them in a training pass (a hook a compiled graph skipped sees none at all)."""
        return bool(self.libraries.get("forwards_counted")) and any(p.forwards for p in self.training_epochs)

    @property
    def evaluated_precision(self) -> str | None:
        """The lowest precision its model was seen evaluating in after training ("bf16", "fp16";
        None: full precision, or not known), from the autocast dtype its forwards ran under."""
        dtypes = {dtype for p in self.evaluations_after_training for dtype in p.autocast}
        return next((short for dtype, short in (("float16", "fp16"), ("bfloat16", "bf16")) if dtype in dtypes), None)

    @property
    def saves_after_training(self) -> list[dict[str, Any]]:
        """Its saves of the model once it had taken an optimizer step (every save, in a version-1 file;
        a save the observer saw hold no model state, such as Accelerate's RNG states per rank, left out)."""
        return [save for save in self.saves if save.get("steps", 1) > 0 and save.get("model_state", True)]


@dataclass
class Observations:
    directory: Path
    ranks: dict[int, RankObservation] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # unreadable files, the observer's own errors
    # Launched ranks that spawned processes themselves (distlab_observer/libraries.py, SPAWN_FILE).
    spawned: list[dict[str, Any]] = field(default_factory=list)

    @property
    def weights(self) -> Path:
        return self.directory / WEIGHTS_FILE


def read_rank_file(path: Path) -> dict[str, Any]:
    """One rank's observations as the schema has them; ValueError (or OSError) naming what is wrong."""
    data = files.read_json(path, RANK_FILE_LIMIT)  # bounded: no NaN, no key twice, nesting limited
    if not isinstance(data, dict) or data.get("schema") != OBSERVATIONS_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not the observer's format: schema {found!r}")
    problem = schema_check.problem(data, schema_check.OBSERVATIONS_SCHEMA)
    if problem:
        raise ValueError(f"not the observer's format: {problem}")
    return data


def _samples(seen: Any) -> dict[str, int]:
    """A pass's counts of the samples its forwards were given (libraries.py), integers only."""
    if not isinstance(seen, dict):
        return {}
    return {key: int(seen[key]) for key in ("trained_forwards", "oversized", "largest", "batch_most")
            if isinstance(seen.get(key), int) and not isinstance(seen.get(key), bool)}


def load(observe_dir: Path | str) -> Observations:
    """Every rank.<r>.json the observer wrote under observe_dir, each pass held against its streamed
    line where the harness collected them, and the observer's error files."""
    directory = Path(observe_dir)
    observations = Observations(directory)
    if directory.is_symlink():  # where the folder is expected, a link: tampering, never followed
        observations.problems.append(f"{directory.name} is a symbolic link, not the observer's folder (never followed)")
        return observations
    streamed = read_streamed_passes(directory, observations.problems)
    for path in sorted(directory.glob(RANK_FILES)):
        try:
            data = read_rank_file(path)
            rank = int(data["rank"])
            seen = (data.get("libraries") or {}).get("passes") or {}
            observations.ranks[rank] = RankObservation(
                rank=rank, process_groups=data["process_groups"], optimizer_steps=int(data["optimizer_steps"]),
                passes=[LoaderPass(p["loader"], p["dataset_len"], p["sampler"], p["batches"], p["steps"],
                                   p["batch_sizes"], p["indices"], p.get("started"), p.get("step_times", []),
                                   p.get("step_images", []), p.get("steps_before"),
                                   (seen.get(str(i)) or {}).get("forwards", 0 if data.get("libraries") else None),
                                   tuple((seen.get(str(i)) or {}).get("autocast", ())),
                                   _samples(seen.get(str(i))))
                        for i, p in enumerate(data["loader_passes"])],
                saves=data["saves"], model=data["model"], errors=data["errors"], stopped=data.get("stopped"),
                loads=data.get("loads", []), libraries=data.get("libraries") or {},
                training=data.get("training"), timeline=data.get("timeline") or {})
            if streamed is not None:
                observations.ranks[rank].passes_unverified = verify_passes(data, streamed, observations.problems)
        except (OSError, ValueError, KeyError, TypeError) as error:
            observations.problems.append(f"{path.name} unreadable ({type(error).__name__}: {error})")
    for path in sorted(directory.glob(SPAWN_FILES)):
        try:
            note = files.read_json(path, ERRORS_FILE_LIMIT)  # the one bounded reader: no NaN, no deep nesting
            if isinstance(note, dict):
                observations.spawned.append(note)
        except (OSError, ValueError) as error:
            observations.problems.append(f"{path.name} unreadable ({type(error).__name__}: {error})")
    for path in sorted(directory.glob(ERRORS_FILES)):
        first = files.read_text(path, ERRORS_FILE_LIMIT).splitlines()[:1]
        observations.problems.append(f"observer error in {path.name}: {first[0] if first else '?'}")
    return observations


def read_streamed_passes(directory: Path, problems: list[str]) -> dict[tuple[int, int, int], str] | None:
    """The pass lines the harness collected from the run's output ((rank, pid, pass) -> digest), from the
    PASS_NOTES_FILE it wrote once the run had ended (a stopped attempt's folder reads its run's); None
    where there is none (observations made without the harness's runner: nothing to compare with)."""
    path = (directory.parent if directory.name == STOPPED_DIR else directory) / PASS_NOTES_FILE
    try:
        text = files.read_regular_file(path, PASS_NOTES_LIMIT).decode(errors="replace")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        problems.append(f"{PASS_NOTES_FILE} unreadable ({type(error).__name__}: {error})")
        return {}
    streamed: dict[tuple[int, int, int], str] = {}
    for line in text.splitlines():
        found = parse_pass_line(line)
        if found is not None:
            streamed.setdefault(found[:3], found[3])
    return streamed


def verify_passes(data: dict[str, Any], streamed: dict[tuple[int, int, int], str], problems: list[str]) -> str | None:
    """Each of a rank file's passes against the line its process streamed when the pass ended: a pass
    recorded otherwise (its digest differs, or the process streamed passes its record lacks) was changed
    in the process after it ended, a problem; one without a line (the observer's descriptor closed) is
    not evidence. Why the rank's pass records cannot be taken, or None."""
    rank, pid = data["rank"], data.get("pid")
    # By rank and pid: a pid alone repeats across the hosts (and the containers) of one run's ranks.
    lines = {number: digest for (of, owner, number), digest in streamed.items() if (of, owner) == (rank, pid)}
    changed, unstreamed = [], []
    for number, recorded in enumerate(data["loader_passes"]):
        try:
            digest: str | None = pass_digest(recorded["indices"], recorded["steps"])
        except (OverflowError, TypeError):  # no observer writes such indices
            digest = None
        if number not in lines:
            unstreamed.append(number)
        elif lines[number] != digest:
            changed.append(number)
    changed += sorted(number for number in lines if number >= len(data["loader_passes"]))
    if changed:
        problems.append(f"rank {rank}'s record of loader pass {', '.join(map(str, changed[:5]))} differs from what "
                        f"the observer streamed when the pass ended: changed in the process (pid {pid}) before exit")
        return f"rank {rank}'s record of loader pass {changed[0]} changed after the pass ended"
    if unstreamed:
        return (f"no line was streamed for rank {rank}'s loader pass {unstreamed[0]} (pid {pid}): the observer's "
                "stderr was closed or its output lost")
    return None


def merge(observe_dirs: list[Path]) -> Observations:
    """The observations of every node's run directory as one run's (a multi-node job keeps one run
    directory per node): each rank's from the node it ran on. A rank seen on two nodes is a problem
    (the observer check fails), never overwritten."""
    merged = Observations(Path(observe_dirs[0]) if observe_dirs else Path("."))
    for directory in observe_dirs:
        part = load(directory)
        merged.problems += [f"{directory}: {problem}" for problem in part.problems]
        merged.spawned += part.spawned
        for rank, observation in part.ranks.items():
            if rank in merged.ranks:
                merged.problems.append(f"rank {rank} observed on two nodes ({directory})")
            else:
                merged.ranks[rank] = observation
        if (Path(directory) / WEIGHTS_FILE).exists():
            merged.directory = Path(directory)  # rank 0's node: the final weights the grader evaluates
    return merged


PRECISIONS = ("fp32", "bf16", "fp16")  # the labs' --precision, from more bits to fewer (the claim's tolerance grows)


def evaluated_precision(observations: Observations, flag: str | None) -> str | None:
    """The precision a claim of accuracy is held to: the lab's flag, or the lower one rank 0's model
    was seen evaluating in after training (a program's own bf16 autocast), whichever has fewer bits."""
    rank0 = observations.ranks.get(0)
    seen = rank0.evaluated_precision if rank0 is not None else None
    if seen is None or (flag in PRECISIONS and PRECISIONS.index(flag) >= PRECISIONS.index(seen)):
        return flag
    return seen


START_UP_SHARE = 0.1  # of a run's wall time: start-up costing less is not worth a word beside the time budget


def start_up(observations: Observations, wall_seconds: float) -> str:
    """What took the run's time before training proper, where the observer can tell and it is
    START_UP_SHARE of the wall time or more: DataLoader workers starting (libraries.py times each
    multi-process loader iterator's start), and a cold torch.compile (the first step's time beyond a
    typical step's, where torch.compile was called). "" where nothing such was seen."""
    said = []
    for rank in (observations.ranks[r] for r in sorted(observations.ranks)):
        workers = float(rank.libraries.get("worker_start_seconds") or 0.0)
        if workers >= START_UP_SHARE * wall_seconds:
            said.append((workers, f"DataLoader workers took {workers:.1f} s to start on rank {rank.rank} (each "
                                  "epoch's iterator starts them again: persistent_workers=True starts them once, "
                                  "and fewer num_workers start sooner)"))
        first = next((p for p in rank.training_epochs if p.started is not None and len(p.step_times) >= 3), None)
        if rank.libraries.get("compiled") and first is not None and first.started is not None:
            steps = sorted(b - a for a, b in pairwise(first.step_times))
            cold = first.step_times[0] - first.started - steps[len(steps) // 2] - \
                (workers if first is rank.training_epochs[0] else 0.0)
            if cold >= START_UP_SHARE * wall_seconds:
                said.append((cold, f"torch.compile's first step took {cold:.1f} s more than a step on rank "
                                   f"{rank.rank} (a cold compile: a persistent cache, or compiling less, shortens it)"))
    return max(said)[1] if said else ""


# A rank's age on the observer's clock may fall short of the kernel's by the interpreter's start before
# the observer loads (some 0.1 s, a second on a crowded machine) and the clocks' granularity; a clock
# the program slowed falls short by a factor. Beyond both the observer's timings are not the time's.
CLOCK_SLACK_S, CLOCK_AGREEMENT = 2.0, 0.8


def clock_disagreement(observations: Observations) -> str | None:
    """Why the observer's clock cannot be trusted on some rank (its age of the process falls short
    of the kernel's), or None: where the kernel did not say, nothing is known against it."""
    for rank in (observations.ranks[r] for r in sorted(observations.ranks)):
        training = rank.training or {}
        clock, kernel = training.get("clock_age_s"), training.get("kernel_age_s")
        if isinstance(clock, (int, float)) and isinstance(kernel, (int, float)) \
                and clock < CLOCK_AGREEMENT * kernel - CLOCK_SLACK_S:
            return (f"rank {rank.rank}'s process lived {kernel:.1f} s by the kernel's account and {clock:.1f} s by "
                    "the observer's clock: the clock the harness times training with was slowed in the process")
    return None


def throughput(observations: Observations, warmup_steps: int = WARMUP_STEPS) -> float | None:
    """Training images per second of the whole run as the harness timed it (the rule above); None
    when a rank left no timed training after its warm-up (too few steps, or no observations)."""
    rates = []
    for rank in (observations.ranks[r] for r in sorted(observations.ranks)):
        images, seconds, steps_before = 0, 0.0, 0
        for epoch in rank.training_epochs:
            timed = len(epoch.step_times)
            if not timed or epoch.started is None or len(epoch.step_images) != timed:
                return None  # observations of an older observer, or steps the observer could not place
            warm = warmup_steps - steps_before  # steps of this epoch still in the warm-up
            steps_before += timed
            if warm >= timed:
                continue
            start, first = (epoch.started, 0) if warm <= 0 else \
                (epoch.step_times[warm - 1], epoch.step_images[warm - 1])
            images += epoch.step_images[-1] - first
            seconds += epoch.step_times[-1] - start
        if not images or seconds <= 0:
            return None
        rates.append(images / seconds)
    return sum(rates) if rates else None
