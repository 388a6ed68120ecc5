"""What each failed check teaches: what it means, the fix in one line, and the lesson's section.

One row per check the grader can fail (verdict names: `observed:NAME` for what the harness computed
from its observations, `claim:NAME` for a record contradicted by them, the profile's bands by metric).
`detail` of the verdict is what the harness saw ("ranks 0 and 1 both fetched 256 of the same
samples"); this table adds the meaning and the remedy. A crash whose output matches a known error
message (`CRASHES`) is taught the same way: DDP's own messages name the pitfall.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from harness.catalog import REPO

TRAINING = "labs/TRAINING.md"
CONTRACT = "labs/README.md"


@dataclass(frozen=True)
class Lesson:
    meaning: str
    fix: str
    section: str  # a lesson page and its anchor

    def link(self, root: str = "") -> str:
        return f"{root}{self.section}"


DDP_ADDS = f"{TRAINING}#what-ddp-adds-labsddptrainpy"
ONE_MODEL = f"{TRAINING}#one-model-at-the-end-of-training"
CHECKPOINTS = f"{TRAINING}#checkpoints-that-resume"
LESSONS = {
    "observed:shards_disjoint": Lesson(
        "Ranks trained on the same samples: each rank must see its own 1/world_size of the data, or the "
        "world size buys nothing.", "Give the DataLoader a DistributedSampler(dataset, num_replicas=world_size, "
        "rank=rank).", DDP_ADDS),
    "observed:shards_cover": Lesson(
        "Some training samples were never seen in an epoch: the shards must add up to the whole set.",
        "Let DistributedSampler split the whole dataset; do not cut the dataset per rank by hand.", DDP_ADDS),
    "observed:order_changes_per_epoch": Lesson(
        "Every epoch visited the samples in the same order: DistributedSampler shuffles with the epoch as "
        "its seed, and without set_epoch the seed never changes.", "Call sampler.set_epoch(epoch) at the "
        "start of every epoch.", DDP_ADDS),
    "observed:replicas_identical": Lesson(
        "The ranks evaluated or saved different models: gradients not averaged (each trained its own), "
        "parameters never made equal at the start (Horovod: no broadcast_parameters, with a seed per rank), "
        "or BatchNorm running statistics left per rank (each saw only its small batch) on a rank that then "
        "evaluated or saved.", "Wrap the model in DistributedDataParallel and let every backward all-reduce "
        "(Horovod: hvd.broadcast_parameters(model.state_dict(), root_rank=0) before training); average "
        "BatchNorm buffers (or --sync-bn) before evaluating and saving.", ONE_MODEL),
    "observed:buffers_identical": Lesson(
        "BatchNorm's running statistics ended different on each rank: each rank's forward updates them from "
        "its own batches (DDP only broadcasts rank 0's at the start of each forward). Harmless where only "
        "rank 0 evaluates and saves, as here; a rank that evaluates with its own counts with another model.",
        "Average them over the ranks before evaluating and saving (one all_reduce of the buffers, divided by "
        "the world size), or broadcast rank 0's.", ONE_MODEL),
    "observed:checkpoint_loads": Lesson(
        "The checkpoint the program saved last does not load into the model it trained: resuming from it "
        "fails.", "Save the model's own state_dict(): under DDP, model.module.state_dict(), whose keys have "
        "no 'module.' prefix; a dict of tensors, never the model object (torch.save(model)).", CHECKPOINTS),
    "observed:resume_continues": Lesson(
        "Restarted from its checkpoint, the program did not go on where it stopped: it trained an epoch "
        "twice (the checkpoint recorded the epoch it finished, not the next one), or started again.",
        "Save epoch + 1, the next epoch to run, with the model and optimizer, and start the loop there when "
        "the checkpoint exists (and call sampler.set_epoch(epoch) in every epoch).", CHECKPOINTS),
    "observed:one_writer_per_checkpoint": Lesson(
        "Several ranks wrote the same checkpoint file at once: the replicas are identical, and concurrent "
        "writes can leave a torn file. LOCAL_RANK == 0 is one writer per node: on a cluster's shared file "
        "system, one per node write the same file.", "Save only on the global rank 0 (dist.get_rank() == 0, "
        "or RANK, never LOCAL_RANK), then barrier.", DDP_ADDS),
    "observed:process_group": Lesson(
        "The process group was not the one asked for (backend or world size), or none was made.",
        "Call dist.init_process_group(backend) with the launcher's environment (RANK, WORLD_SIZE).", DDP_ADDS),
    "observed:optimizer_steps_equal": Lesson(
        "Ranks took different numbers of optimizer steps: an uneven last batch leaves one rank waiting "
        "at an all-reduce the others never join.", "drop_last=True in the DistributedSampler and the "
        "DataLoader, so every rank runs the same steps.", DDP_ADDS),
    "observed:observer": Lesson(
        "The harness could not see every rank train: a rank wrote no observations (it exited before "
        "Python's exit handlers, or something stopped the observer).", "End normally (return from main; "
        "no os._exit), and leave torch's functions as torch made them.",
        f"{CONTRACT}#5-what-the-harness-observes-the-record-is-a-claim"),
    "img_per_sec_ratio": Lesson(
        "Training ran slower than the course's lab beside it, in the same cell and conditions.",
        "Look for work in the step loop that DDP does not need (extra syncs, .item() per step, busy waits).",
        f"{TRAINING}#what-the-grader-checks-itself"),
    "final_accuracy": Lesson(
        "The harness evaluated rank 0's final weights and they did not reach the expected accuracy.",
        "Check the learning-rate scaling rule (lr x world_size) and that the labels reach the loss unchanged.",
        f"{TRAINING}#what-ddp-adds-labsddptrainpy"),
    "run": Lesson(
        "The run did not end well: a rank failed, hung, or broke the contract. The reason names the rank and "
        "its last exception.",
        "Repeat the grader's checks on your machine: `distlab grade --program ddp=yours.py` runs your program as "
        "the grader does, at each world size, and prints what failed; to read a failing rank's log, run it "
        "alone with `distlab run ddp -n N --launcher torchrun --program yours.py -- --smoke`.",
        f"{CONTRACT}#the-contract"),
    "time": Lesson(
        "The slowest run took longer than the profile's time budget.",
        "Profile the step loop; a correct program runs in the lab's time.",
        f"{TRAINING}#what-the-grader-checks-itself"),
    "unused_parameters": Lesson(
        "DDP waited for gradients of parameters that this step's forward never used: its reducer stops "
        "at the next step, because it cannot finish the last one.", "Pass find_unused_parameters=True to "
        "DDP (or static_graph=True when the unused set never changes), or use every parameter each step.",
        f"{TRAINING}#unused-parameters"),
    "sandbox": Lesson(
        "The program tried something the grader's sandbox does not allow: each submission gets loopback "
        "only, its own folder to write, and limits on memory, processes, files and output.",
        "Train with what the lab gives you: no network, no files outside your run directory.",
        "docs/threat-model.md#what-a-submission-gets"),
}

CLAIM = Lesson("The record claimed what the harness did not observe.", "Report what your program measured; "
               "the harness checks the record against what it saw.",
               f"{CONTRACT}#5-what-the-harness-observes-the-record-is-a-claim")

# Crash messages that name a pitfall: (pattern in the error a failed run ended with, lesson key, what
# it says). The error's own words only: torch's warnings name find_unused_parameters in runs that pass.
CRASHES = (
    (re.compile(r"\w(?:Error|Exception): Expected to have finished reduction in the prior iteration"),
     "unused_parameters", "DDP stopped: 'Expected to have finished reduction in the prior iteration' "
                          "(parameters unused in a step)"),
)


def lesson_for(check: str) -> Lesson | None:
    if check in LESSONS:
        return LESSONS[check]
    if check.startswith("claim:"):
        return CLAIM
    if check.startswith("check:"):  # the record's own check: taught where the harness observes the same
        return LESSONS.get(f"observed:{check[len('check:'):]}")
    return None


def crash_lessons(texts: list[str]) -> list[tuple[str, str]]:
    """(lesson key, what was seen) for each known crash message in the output of failed runs (the
    caller passes only theirs): matched in an exception's line, never in a warning."""
    return [(key, seen) for pattern, key, seen in CRASHES if any(pattern.search(text) for text in texts)]


# ------------------------------------------------------------------------------- where lessons lie
# Feedback links a lesson as ROOT + section ("labs/TRAINING.md#..."). A student reads feedback mailed,
# on a course platform or in an LMS, never on the grader's disk: the root is an address on the web
# (--lessons URL, else the course repository's pages at the commit that graded them). Links into
# this checkout's files (file://) are made only when asked for by name (--lessons local): staff who
# read the pages on the grading machine itself.
LOCAL = "local"  # --lessons local
WEB_SCHEMES = ("https", "http")
SSH_REMOTE = re.compile(r"(?:ssh://)?git@([^:/]+)[:/](.+)")
NO_ADDRESS = ("the feedback would link the lessons into this machine's files (file://), which students reading it "
              "mailed, on Gradescope, PrairieLearn or an LMS cannot open, and this checkout has no https origin to "
              "link; give --lessons URL (where students read labs/, ending in /), or --lessons local for links that "
              "open only on this machine")


def lessons_argument(text: str) -> str:
    """--lessons: `local`, or the address of the folder that holds labs/ (https, http or file), made to
    end in / (a lesson's section is appended to it)."""
    if text == LOCAL:
        return text
    parts = urlsplit(text)
    if parts.scheme not in (*WEB_SCHEMES, "file") or (parts.scheme in WEB_SCHEMES and not parts.hostname):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no address a browser opens; give the https address of the folder that holds labs/ "
            f"(e.g. https://github.com/course/ddp-lab/blob/main/), or {LOCAL!r} for this checkout's files")
    return text if text.endswith("/") else text + "/"


def local_lesson_root() -> str:
    """This checkout's lesson pages, as file:// links: they open only on this machine."""
    return REPO.as_uri() + "/"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def web_address(remote: str) -> str | None:
    """A remote's https address without credentials (git@host:o/r.git and https://user:token@host/o/r)."""
    ssh = SSH_REMOTE.fullmatch(remote)
    if ssh:
        remote = f"https://{ssh.group(1)}/{ssh.group(2)}"
    parts = urlsplit(remote)
    if parts.scheme not in WEB_SCHEMES or not parts.hostname:
        return None  # a local path, or a protocol a browser cannot open
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    path = parts.path.removesuffix("/").removesuffix(".git")
    return urlunsplit(("https", host, path, "", ""))


def course_lesson_root() -> str | None:
    """The course repository's lesson pages at this checkout's commit: `<origin>/blob/<commit>/`
    (GitHub's and Gitea's layout; GitLab redirects it). None outside a checkout, or without an
    origin a browser can open: then the caller asks for --lessons."""
    if _git("rev-parse", "--show-toplevel") != str(REPO):
        return None  # an installed package, or a folder inside someone else's repository
    remote, commit = _git("remote", "get-url", "origin"), _git("rev-parse", "HEAD")
    address = web_address(remote) if remote else None
    return f"{address}/blob/{commit}/" if address and commit else None


def lesson_root(given: str | None) -> str | None:
    """Where feedback links the lessons: --lessons as given (lessons_argument: an address ending in /,
    or `local`: this checkout's files), else the course repository's (course_lesson_root); None when
    there is no address students can open (the caller refuses with NO_ADDRESS)."""
    if given == LOCAL:
        return local_lesson_root()
    if given:
        return given if given.endswith("/") else given + "/"
    return course_lesson_root()
