"""What the harness sees of one rank, from torch's own entry points, without the program's help.

`install(directory)` (called by sitecustomize.py when DISTLAB_OBSERVE_DIR is set) arms hooks that
wait for the program to import torch (and horovod.torch); nothing is imported before it does. Then:

- the process group: torch.distributed.init_process_group and Horovod's hvd.init(), as torch and
  Horovod report them afterwards (backend, world size, rank), not as the program asked;
- the data: every sample index each DataLoader handed out, one list per pass over the loader (an
  epoch), with the dataset's length and the optimizer steps taken during that pass: passes with
  steps are training, passes without are evaluation;
- the optimizer steps (torch's global step hooks, so Horovod's DistributedOptimizer too), each with
  the time it ended and the images its pass had handed out by then: the harness times training
  itself, rather than reading the program's img_per_sec;
- every torch.save, by resolved path, followed through a rename (checkpoints are written to a
  temporary file and renamed into place), with the optimizer steps taken before it: the harness
  loads the last one into the model itself (harness/observe/checkpoint_loads.py); and every torch.load of a
  file (the first LOADS_KEPT), so a resumed run shows which checkpoint it read;
- at exit: the model the optimizers trained (found from their parameters), its state's digests and
  the state itself (final_weights.pt on rank 0, final_weights.<r>.pt on the others), so the harness
  can evaluate each rank's own model where the replicas differ.

- training evidence (issue 44): the digest of the parameters the optimizers update before the first
  step and at exit (a program that trained nothing ends as it began), after sampled steps (1, 2, 4,
  ...: compared across ranks, the replicas must be equal during training, not only at the end), and
  the process's age on the observer's clock beside the kernel's account of it (/proc);
- at exit, whether each of its hooks is still its own: one a program replaced is an error of the
  observer's (the checks then say so), never a silent gap;
- as each loader pass ends (its iterator's StopIteration, its next pass, or the iterator dropped; a
  pass still open, at exit), one line with the pass's digest (fileformat.PASS_LINE: the indices kept
  and the steps, digests.pass_digest) on this process's stderr, through a descriptor taken when this
  module loads: the harness keeps the lines as the launcher passes them on and holds each recorded
  pass against its line, so a record rewritten before exit shows (issue 44, "rewrites the observer").

The observer's clock (time.perf_counter) and the os functions it reads /proc with are taken when
this module loads, before the program's first line: a program that slows time.perf_counter slows
its own timing, not the harness's.

A resume cell asks the first attempt to stop (fileformat.STOP_AFTER_EPOCHS): once that many
training epochs are done, at the first optimizer step of the next, the observer writes this
attempt's observations to <directory>/stopped/ and ends the rank (fileformat.STOP_EXIT_CODE), as a
failure would; torchrun then starts every rank again, and the program resumes from its checkpoint.

Everything goes to <directory>/rank.<r>.json at exit, written atomically; nothing is written per step
(a line per loader pass on stderr, above).
The hooks cost a list append per batch, a clock read and two array appends per step. Any failure of
the observer is caught and written to <directory>/observer-errors.<pid>.txt: the program runs as it
would without it.
The file names and the schema's name are fileformat.py's; the digests (digests.py) are shared with
harness/observe/accuracy.py.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import os
import sys
import time
import traceback
import weakref
from array import array
from collections.abc import Callable
from typing import Any

from .digests import pass_digest, state_digest
from .fileformat import (
    ERRORS_FILE,
    PASS_LINE,
    RANK_FILE,
    RANK_WEIGHTS_FILE,
    SCHEMA,
    SCHEMA_VERSION,
    STOP_AFTER_EPOCHS,
    STOP_EXIT_CODE,
    STOPPED_DIR,
    WEIGHTS_FILE,
)
from .libraries import Libraries

# Where a rank's number is before any process group exists, launcher by launcher (labs/README.md).
_os_replace = os.replace  # the real one: ours is hooked once torch loads
# The clock, taken before the program's first line runs (sitecustomize imports this module): a program
# that slows time.perf_counter slows its own timing, not the harness's (issue 44, "slows its own clock").
_clock = time.perf_counter
_os_open, _os_read, _os_close, _os_write, _getpid = os.open, os.read, os.close, os.write, os.getpid


def _own_stderr() -> int | None:
    """A descriptor of this process's stderr, taken before the program's first line: where each pass's
    line goes (fileformat.PASS_LINE), whatever the program does with sys.stderr or descriptor 2 later."""
    try:
        return os.dup(2)  # not inherited across exec (PEP 446): a child's program never holds it
    except OSError:  # no stderr at all
        return None


_stderr = _own_stderr()

# The optimizer steps after which each rank digests the parameters the optimizers update: the
# replicas must be equal after every step of a data-parallel run, not only at the end (a program that
# trains each rank alone and broadcasts rank 0's state after each epoch ends with equal replicas).
# Powers of two: a few digests whatever the run's length (a ResNet-18's 45 MB, about 0.1 s each).
SAMPLED_STEPS = tuple(2 ** k for k in range(24))
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "SLURM_PROCID")
LOADS_KEPT = 100  # torch.loads of files noted per rank

_observer: Observer | None = None


def install(directory: str) -> None:
    """Arm the hooks in this process (once); they take effect when torch and horovod.torch load."""
    global _observer
    if _observer is not None:
        return
    _observer = Observer(directory)
    watcher = _PostImportWatcher({"torch": _observer.on_torch, "horovod.torch": _observer.on_horovod_torch,
                                  **_observer.libraries.watched()})
    sys.meta_path.insert(0, watcher)
    # Registered before the program's own handlers (and torch's), so it runs after all of them.
    atexit.register(_observer.finish)
    for name in list(watcher.callbacks):  # already imported (an embedding interpreter): hook now
        if name in sys.modules:
            watcher.fire(name, sys.modules[name])


class _PostImportWatcher(importlib.abc.MetaPathFinder):
    """Calls back once a watched module has been executed, before its importer gets it.

    It finds the module with the finders after it and wraps only the loader's exec_module; once
    the module has run, its __loader__ and __spec__.loader are the real loader again. A callback
    fires once, at the module's execution: a mere importlib.util.find_spec (a library asking
    whether torch is installed) does not use it up.
    """

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self.callbacks = callbacks
        self._searching: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.callbacks or fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self, fullname)
        return spec

    def fire(self, name: str, module: Any) -> None:
        callback = self.callbacks.pop(name, None)
        if callback is not None:
            callback(module)  # each callback catches its own errors


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, watcher: _PostImportWatcher, name: str) -> None:
        self._loader, self._watcher, self._name = loader, watcher, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._watcher.fire(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PassRecorder:
    """One pass over one DataLoader as it happens: the indices it handed out, batch by batch."""

    __slots__ = ("loader", "dataset", "dataset_len", "sampler", "indices", "batch_lengths", "yielded",
                 "steps_start", "steps_end", "non_integer", "started", "images_yielded", "step_times",
                 "step_images", "now", "batch_rows", "announced", "iterator")

    def __init__(self, loader: int, dataset: int, dataset_len: int | None, sampler: str, steps: int,
                 now: Callable[[], float] = _clock) -> None:
        self.loader, self.dataset, self.dataset_len, self.sampler = loader, dataset, dataset_len, sampler
        self.indices = array("q")  # 8 bytes an index: a full CIFAR-10 run keeps a few MB, not ints
        self.batch_lengths = array("q")
        self.yielded = 0
        self.steps_start = self.steps_end = steps
        self.non_integer = False
        # The clock of this process only (perf_counter): times are compared within one rank. `now` leaves
        # out the observer's own pauses (Observer.training_clock).
        self.now = now
        self.started = now()
        self.images_yielded = 0  # samples in the batches the loop has received so far
        self.step_times = array("d")  # when each optimizer step taken during this pass ended
        self.step_images = array("q")  # images_yielded at that step
        # The leading sizes of the tensors in the batch the loop received last: a forward with gradients
        # given more samples than that trained on data this loader did not hand out (libraries.py).
        self.batch_rows: tuple[int, frozenset[int]] | None = None
        self.announced = False  # its line streamed (Observer.announce): the pass is over
        self.iterator: Any = None  # a weak reference to its loader iterator, which announces it when dropped

    def yielded_batch(self) -> None:
        if self.yielded < len(self.batch_lengths):  # a loader hands batches out in the order it drew them
            self.images_yielded += self.batch_lengths[self.yielded]
        self.yielded += 1

    def stepped(self) -> None:
        self.step_times.append(self.now())
        self.step_images.append(self.images_yielded)

    def add(self, index: Any) -> None:
        if isinstance(index, int):  # a loader without batching hands out one index at a time
            self.indices.append(index)
            self.batch_lengths.append(1)
            return
        before = len(self.indices)
        try:
            self.indices.extend(index)  # a list of ints: one C loop
        except TypeError:
            try:
                self.indices.extend(int(i) for i in index)  # tensors, numpy integers
            except (TypeError, ValueError):
                del self.indices[before:]
                self.non_integer = True  # keys that are not positions (a dict-like dataset): nothing to compare
                return
        self.batch_lengths.append(len(self.indices) - before)

    def kept(self) -> array:
        # Workers may have been handed batches ahead of the loop (prefetch): keep those it received.
        return self.indices[:sum(self.batch_lengths[:self.yielded])]

    def digest(self) -> str:
        """What the harness recomputes from to_json() (digests.pass_digest): the indices kept, the steps."""
        return pass_digest(self.kept(), self.steps_end - self.steps_start)

    def to_json(self) -> dict[str, Any]:
        return {"loader": self.loader, "dataset": self.dataset, "dataset_len": self.dataset_len,
                "sampler": self.sampler, "batches": self.yielded, "steps": self.steps_end - self.steps_start,
                "steps_before": self.steps_start,
                "batch_sizes": sorted(set(self.batch_lengths[:self.yielded])), "non_integer": self.non_integer,
                "indices": self.kept().tolist(), "started": self.started,
                "step_times": self.step_times.tolist(), "step_images": self.step_images.tolist()}


class Observer:
    """Everything one process observed; written once, at exit."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.process_groups: list[dict[str, Any]] = []
        self.passes: list[PassRecorder] = []
        self.loaders: dict[int, tuple[int, Any]] = {}  # id(index sampler) -> (number, the sampler, kept alive)
        self.datasets: dict[int, tuple[int, Any]] = {}
        self.steps = 0
        self.step_depth = 0
        self.last_batch_from: PassRecorder | None = None  # the pass whose batch the loop received last
        self.optimizers: list[Any] = []  # kept alive: the program's may be gone by exit
        self.model: Any = None
        self.saves: list[dict[str, Any]] = []
        self.loads: list[dict[str, Any]] = []
        self.saved_paths: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.torch: Any = None
        self._original_save: Any = None
        self.stop_after = _stop_after()  # training epochs before a resume cell's stop; None: never
        self.stopped: dict[str, Any] | None = None
        self.libraries = Libraries(self)  # beyond torch's entry points: libraries.py
        self.born = _clock()  # this process's age on the observer's clock, compared at exit with the kernel's
        self.params_at_start: str | None = None  # the optimizers' parameters before their first step
        self.params_at_steps: dict[str, str] = {}  # step (SAMPLED_STEPS) -> their digest after it
        # Each hook as installed: what it is, how to find what stands there now, and ours. At exit a hook
        # that is no longer ours is an error of the observer's (its evidence stopped there), never a pass.
        self.hooks: list[tuple[str, Callable[[], Any], Any]] = []
        self.paused = 0.0  # seconds the observer spent digesting parameters between steps

    # ------------------------------------------------------------------------------------- errors

    def guard(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as error:  # noqa: BLE001 - never the program's problem
            self.error(what, error)
            return None

    def error(self, what: str, error: BaseException) -> None:
        line = f"{what}: {type(error).__name__}: {error}"
        if len(self.errors) < 20:  # a hook failing at every batch must not fill the memory
            self.errors.append(line)
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, ERRORS_FILE.format(pid=os.getpid())), "a") as out:
                out.write(line + "\n" + "".join(traceback.format_exception(error)) + "\n")
        except OSError:
            pass

    # -------------------------------------------------------------------------------------- hooks

    def on_torch(self, torch: Any) -> None:
        self.torch = torch
        self._original_save = torch.serialization.save  # final_weights.pt is not the program's save
        for what, hook in (("process group hook", self._hook_process_group), ("data hook", self._hook_data),
                           ("optimizer hook", self._hook_optimizer), ("save hook", self._hook_save),
                           ("libraries hook", self.libraries.on_torch)):
            self.guard(what, hook, torch)

    def on_horovod_torch(self, hvd: Any) -> None:
        self.guard("horovod hook", self._hook_horovod, hvd)

    def _hook_process_group(self, torch: Any) -> None:
        dist = torch.distributed
        if not dist.is_available():
            return
        c10d = dist.distributed_c10d
        original = c10d.init_process_group

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.guard("init_process_group", self._note_torch_group, "init_process_group")
            return result

        c10d.init_process_group = init_process_group
        self.hooks.append(("torch.distributed's init_process_group", lambda: c10d.init_process_group,
                           init_process_group))
        if dist.init_process_group is original:
            dist.init_process_group = init_process_group

    def _note_torch_group(self, how: str) -> None:
        dist = self.torch.distributed
        # Without a backend asked for, torch picks one per device type: get_backend() then says
        # "undefined", the backend config ("cpu:gloo,cuda:nccl") what each device type uses.
        config = getattr(dist, "get_backend_config", None)
        self.process_groups.append({"api": "torch.distributed", "seen_at": how, "backend": str(dist.get_backend()),
                                    "backend_config": str(config()) if config else None,
                                    "world_size": dist.get_world_size(), "rank": dist.get_rank()})

    def _hook_horovod(self, hvd: Any) -> None:
        original = hvd.init

        @functools.wraps(original)
        def init(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.guard("hvd.init", self._note_horovod_group, hvd, "hvd.init")
            return result

        hvd.init = init
        mpi_ops = sys.modules.get("horovod.torch.mpi_ops")
        if mpi_ops is not None and mpi_ops.init is original:
            mpi_ops.init = init  # type: ignore[attr-defined]  # Horovod's module, typed by nothing

    def _note_horovod_group(self, hvd: Any, how: str) -> None:
        controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "unknown"
        self.process_groups.append({"api": "horovod", "seen_at": how, "backend": "horovod", "controller": controller,
                                    "world_size": hvd.size(), "rank": hvd.rank()})

    def _hook_data(self, torch: Any) -> None:
        base = torch.utils.data.dataloader._BaseDataLoaderIter
        next_index, next_batch = base._next_index, base.__next__
        observer = self

        # _next_index is where a loader iterator draws the indices of its next batch from its sampler
        # (in this process, also for worker processes); a new sampler iterator means a new pass.
        @functools.wraps(next_index)
        def _next_index(self: Any) -> Any:
            sampler_iter = self._sampler_iter
            index = next_index(self)
            try:
                current = self.__dict__.get("_distlab_pass")
                if current is None or current[0] is not sampler_iter:
                    if current is not None:  # the iterator began its next pass (persistent workers): one is over
                        observer.guard("pass line", observer.announce, current[1])
                    current = (sampler_iter, observer._new_pass(self))
                    self.__dict__["_distlab_pass"] = current
                current[1].add(index)
            except Exception as error:  # noqa: BLE001
                observer.error("loader index", error)
            return index

        @functools.wraps(next_batch)
        def __next__(self: Any) -> Any:
            try:
                batch = next_batch(self)
            except BaseException as error:
                # The pass ended (StopIteration; another error may leave it going on): the steps up to here count.
                observer._end_of_batch(self, yielded=False, ended=isinstance(error, StopIteration))
                raise
            observer._end_of_batch(self, yielded=True, batch=batch)
            return batch

        base._next_index, base.__next__ = _next_index, __next__
        self.hooks += [("the DataLoader iterator's _next_index", lambda: base.__dict__.get("_next_index"), _next_index),
                       ("the DataLoader iterator's __next__", lambda: base.__dict__.get("__next__"), __next__)]

    def _new_pass(self, iterator: Any) -> PassRecorder:
        sampler, dataset = iterator._index_sampler, iterator._dataset
        loader = self.loaders.setdefault(id(sampler), (len(self.loaders), sampler))[0]
        dataset_number = self.datasets.setdefault(id(dataset), (len(self.datasets), dataset))[0]
        try:
            dataset_len = len(dataset)
        except TypeError:  # an iterable dataset
            dataset_len = None
        inner = getattr(sampler, "sampler", sampler)  # a BatchSampler draws from the sampler the program chose
        new = PassRecorder(loader, dataset_number, dataset_len, type(inner).__name__, self.steps,
                           self.training_clock)
        self.passes.append(new)
        # A loop that breaks off its pass drops the iterator without a StopIteration: its pass is over then.
        new.iterator = weakref.ref(iterator, lambda _: self.guard("pass line", self.announce, new))
        return new

    def _end_of_batch(self, iterator: Any, yielded: bool, batch: Any = None, ended: bool = False) -> None:
        current = iterator.__dict__.get("_distlab_pass")
        if current is not None and not current[1].announced:  # an ended pass's record stays as streamed
            current[1].steps_end = self.steps
            if yielded:
                current[1].yielded_batch()
                current[1].batch_rows = self.guard("batch rows", batch_rows, self.torch, batch)
                self.last_batch_from = current[1]
            if ended:
                self.guard("pass line", self.announce, current[1])

    def announce(self, recorder: PassRecorder) -> None:
        """Once a pass is over, its digest on this process's own stderr (fileformat.PASS_LINE), once: the
        harness reads it as the launcher passes it on, before the program can change the record at exit."""
        if recorder.announced:
            return
        recorder.announced = True
        number = next((n for n, p in enumerate(self.passes) if p is recorder), None)
        if _stderr is None or number is None:  # no stderr, or a resume cell's stop left the pass out
            return
        line = PASS_LINE.format(rank=self.rank(), pid=_getpid(), number=number, digest=recorder.digest())
        _os_write(_stderr, f"{line}\n".encode())  # one write, one line: a pipe keeps it whole (PIPE_BUF)

    def _hook_optimizer(self, torch: Any) -> None:
        # Global hooks fire around every Optimizer.step. A wrapper optimizer whose step calls its base
        # class's (Horovod's DistributedOptimizer) fires them twice: only the outermost step counts.
        def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.step_depth += 1
            if self.steps == 0 and self.step_depth == 1 and self.params_at_start is None:
                self.params_at_start = self.guard("parameters at start", _params_digest, torch, [optimizer])
            if self.stop_after is not None and self.step_depth == 1:
                self._stop_if_due()

        def post(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.step_depth -= 1
            if self.step_depth > 0:
                return
            self.steps += 1
            if self.last_batch_from is not None:  # the step trained on that pass's batches
                # On a GPU the step is only queued when step() returns: wait for it, so that its time is
                # when the GPU finished it (estimated cost: the CPU no longer queues the next step while
                # this one runs, some 0.1-0.3 ms of a ResNet-18 step's 10-15 ms on an H200, 1-3%).
                params = optimizer.param_groups[0]["params"] if optimizer.param_groups else []
                if params and params[0].is_cuda:
                    torch.cuda.synchronize(params[0].device)
                self.last_batch_from.stepped()
            if not self.optimizers or optimizer is not self.optimizers[-1]:
                self.guard("optimizer", self._note_optimizer, optimizer)
            if self.steps in SAMPLED_STEPS and self.stopped is None:
                began = _clock()
                found = self.guard("parameters at a step", _params_digest, torch, self.optimizers)
                if found is not None:
                    self.params_at_steps[str(self.steps)] = found
                self.paused += _clock() - began

        import importlib

        hooks = importlib.import_module("torch.optim.optimizer")  # torch.optim deletes the attribute
        hooks.register_optimizer_step_pre_hook(pre)
        hooks.register_optimizer_step_post_hook(post)
        for what, table, ours in (("pre", "_global_optimizer_pre_hooks", pre),
                                  ("post", "_global_optimizer_post_hooks", post)):
            def standing(table: str = table, ours: Any = ours) -> Any:  # ours, while still registered
                return ours if any(hook is ours for hook in getattr(hooks, table).values()) else None

            self.hooks.append((f"torch.optim's global step {what}-hook", standing, ours))

    def _stop_if_due(self) -> None:
        """A resume cell's stop: at the first step of a pass, once stop_after training passes are done.
        The pass just begun is left out (it took no step), the observations written, the rank ended."""
        current = self.last_batch_from
        if current is None or self.stop_after is None or self.steps != current.steps_start:
            return
        done = sum(1 for p in self.passes if p is not current and p.steps_end > p.steps_start)
        if done < self.stop_after:
            return
        self.passes.remove(current)
        self.stopped = {"after_epochs": done, "steps": self.steps}
        self.finish()
        os._exit(STOP_EXIT_CODE)  # no handler of the program runs: the rank ends as a killed one would

    def _note_optimizer(self, optimizer: Any) -> None:
        if any(known is optimizer for known in self.optimizers):
            return
        self.optimizers.append(optimizer)
        self.model = find_trained_model(self.torch, self.optimizers)
        self.guard("model hooks", self.libraries.model_found, self.model)
        self._probe_groups()

    def _probe_groups(self) -> None:
        """A process group made without the hooked entry points (imported before them) still shows here."""
        if self.process_groups:
            return
        dist = self.torch.distributed
        if dist.is_available() and dist.is_initialized():
            self._note_torch_group("first optimizer step")
        hvd = sys.modules.get("horovod.torch")
        if hvd is not None and hvd.is_initialized():
            self._note_horovod_group(hvd, "first optimizer step")

    def _hook_save(self, torch: Any) -> None:
        original = torch.serialization.save

        @functools.wraps(original)
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(obj, f, *args, **kwargs)
            self.guard("torch.save", self._note_save, f)
            return result

        torch.serialization.save = save
        self.hooks.append(("torch.serialization.save", lambda: torch.serialization.save, save))
        if torch.save is original:
            torch.save = save
        original_load = torch.serialization.load

        @functools.wraps(original_load)
        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_load(f, *args, **kwargs)
            if len(self.loads) < LOADS_KEPT:  # a program may torch.load its data too: thousands of files
                self.guard("torch.load", self._note_load, f)
            return result

        torch.serialization.load = load
        if torch.load is original_load:
            torch.load = load
        # A checkpoint is commonly written to a temporary file and renamed into place: follow it.
        for name in ("replace", "rename"):
            self._hook_rename(name)

    def _hook_rename(self, name: str) -> None:
        original = getattr(os, name)

        @functools.wraps(original)
        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(src, dst, *args, **kwargs)
            if self.saved_paths:
                self.guard("rename", self._note_rename, src, dst, kwargs)
            return result

        setattr(os, name, rename)

    def _note_save(self, f: Any) -> None:
        target = f if isinstance(f, (str, bytes, os.PathLike)) else getattr(f, "name", None)
        if not isinstance(target, (str, bytes, os.PathLike)):
            return  # an in-memory buffer: nothing on disk
        path = os.path.realpath(os.fsdecode(target))
        entry = {"path": path, "written_as": path, "rank": self.rank(), "steps": self.steps}
        self.saves.append(entry)
        self.saved_paths[path] = entry

    def _note_load(self, f: Any) -> None:
        target = f if isinstance(f, (str, bytes, os.PathLike)) else getattr(f, "name", None)
        if isinstance(target, (str, bytes, os.PathLike)):
            self.loads.append({"path": os.path.realpath(os.fsdecode(target)), "steps": self.steps})

    def _note_rename(self, src: Any, dst: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get("src_dir_fd") is not None or kwargs.get("dst_dir_fd") is not None:
            return
        entry = self.saved_paths.pop(os.path.realpath(os.fsdecode(src)), None)
        if entry is not None:
            entry["path"] = os.path.realpath(os.fsdecode(dst))
            self.saved_paths[entry["path"]] = entry

    def training_clock(self) -> float:
        """The observer's clock less the time it spent on its own digests: the harness times the
        program's training, not the observer (a ResNet-18's digest is some 0.1 s on a CPU)."""
        return _clock() - self.paused

    # ----------------------------------------------------------------------------------- at exit

    def rank(self) -> int:
        if self.process_groups:
            return int(self.process_groups[-1]["rank"])
        for name in RANK_VARIABLES:
            value = os.environ.get(name, "")
            if value.isdigit():
                return int(value)
        return 0

    def rank_source(self) -> str:
        if self.process_groups:
            return self.process_groups[-1]["api"]
        return next((f"env {name}" for name in RANK_VARIABLES if os.environ.get(name, "").isdigit()), "default 0")

    def finish(self) -> None:
        """At exit: the final model, then rank.<r>.json. Processes that observed nothing write nothing."""
        try:
            if not (self.process_groups or self.passes or self.steps or self.saves):
                return  # a launcher, a DataLoader worker, a helper process
            rank = self.rank()
            for recorder in self.passes:  # passes still open at exit (a loader iterator the program kept)
                self.guard("pass line", self.announce, recorder)
            for what, now, ours in self.hooks:
                if now() is not ours:
                    self.error("hooks", RuntimeError(f"{what} was replaced during the run: the observer saw nothing "
                                                     "through it from then on"))
            directory = os.path.join(self.directory, STOPPED_DIR) if self.stopped else self.directory
            os.makedirs(directory, exist_ok=True)
            observed = {
                "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "rank": rank, "rank_source": self.rank_source(),
                "pid": os.getpid(), "argv": sys.argv, "process_groups": self.process_groups,
                "optimizer_steps": self.steps, "loader_passes": [p.to_json() for p in self.passes],
                "saves": self.saves, "loads": self.loads,
                "model": self.guard("final model", self._final_model, rank),
                "errors": self.errors,  # the same list: the final model's errors are in it too
                "stopped": self.stopped,
                "libraries": self.guard("libraries", self.libraries.to_json),
                "training": self.guard("training evidence", self._training_evidence),
            }
            _write_atomically(os.path.join(directory, RANK_FILE.format(rank=rank)), _json_bytes(observed))
        except Exception as error:  # noqa: BLE001
            self.error("finish", error)

    def _training_evidence(self) -> dict[str, Any]:
        """What the parameters were before the first step and after sampled ones, their digest at exit
        (taken the same way: a program that trained nothing ends as it began), and this process's age
        on the observer's clock beside the kernel's account of it (/proc: no Python call of the program's
        stands between), so that a clock the program slowed shows."""
        return {"params_at_start": self.params_at_start, "params_at_steps": self.params_at_steps,
                "params_at_end": _params_digest(self.torch, self.optimizers[:1]) if self.optimizers else None,
                "clock_age_s": _clock() - self.born, "kernel_age_s": _kernel_age()}

    def _final_model(self, rank: int) -> dict[str, Any] | None:
        if self.model is None:
            return None
        torch = self.torch
        with torch.no_grad():
            state = {name: value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
                     for name, value in self.model.state_dict().items()}
        parameters = {name for name, _ in self.model.named_parameters()}
        found = {
            "class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
            "tensors": len(state),
            "state_sha256": state_digest(state),
            "params_sha256": state_digest({k: v for k, v in state.items() if k in parameters}),
            "buffers_sha256": state_digest({k: v for k, v in state.items() if k not in parameters}),
            # Each buffer's own digest and the kind of layer that holds it: which differ across ranks
            # is what the harness names (BatchNorm's running statistics, the course's lesson).
            "buffers": {name: {"sha256": state_digest({name: state[name]})[:16], "module": owner}
                        for name, owner in _buffer_owners(self.model).items() if name in state},
            "weights_file": None,
        }
        if self.stopped is None:  # a stopped attempt's model is not the run's: the resumed one's is
            name = WEIGHTS_FILE if rank == 0 else RANK_WEIGHTS_FILE.format(rank=rank)
            path = os.path.join(self.directory, name)
            temporary = f"{path}.{os.getpid()}.tmp"
            self._original_save(state, temporary)
            _os_replace(temporary, path)
            found["weights_file"] = name
        return found


def _params_digest(torch: Any, optimizers: list[Any]) -> str:
    """sha256 of the parameters the optimizers update, in their order: dtype, shape and exact bytes."""
    import hashlib

    digest = hashlib.sha256()
    with torch.no_grad():
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    tensor = param.detach().cpu().contiguous()
                    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}\0".encode())
                    digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def batch_rows(torch: Any, batch: Any) -> tuple[int, frozenset[int]]:
    """The samples a batch holds, as the most a model given them could be given at once, and the
    leading size of each of its tensors (tuples, lists and dicts of them, a few levels deep).

    The most is the sum of the leading sizes of its tensors of two or more dimensions (inputs, two
    views of one image: a contrastive program concatenates them), or where it has none, the largest
    leading size (a batch of indices, or of one feature each); labels do not add to it."""
    rows: list[tuple[int, int]] = []
    stack, seen = [(batch, 0)], 0
    while stack and seen < 64:  # a batch is a few tensors: a bound, not a limit honest batches meet
        item, depth = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.dim() >= 1:
                rows.append((int(item.shape[0]), item.dim()))
        elif depth < 3 and isinstance(item, (tuple, list)):
            stack.extend((element, depth + 1) for element in item)
        elif depth < 3 and isinstance(item, dict):
            stack.extend((element, depth + 1) for element in item.values())
    inputs = [size for size, dims in rows if dims >= 2]
    most = sum(inputs) if inputs else max((size for size, _ in rows), default=0)
    return most, frozenset(size for size, _ in rows)


def _kernel_age() -> float | None:
    """Seconds since this process started, by the kernel (/proc/self/stat's start time against
    /proc/uptime, in clock ticks); None where /proc does not say."""
    def read(path: str) -> str:
        fd = _os_open(path, os.O_RDONLY)
        try:
            return _os_read(fd, 4096).decode()
        finally:
            _os_close(fd)

    try:
        stat = read(f"/proc/{_getpid()}/stat")
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        uptime = float(read("/proc/uptime").split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _stop_after() -> int | None:
    """The training epochs a resume cell lets the first attempt run (None: no stop, or a restart)."""
    value = os.environ.get(STOP_AFTER_EPOCHS, "")
    if not value.isdigit() or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return int(value)


def _buffer_owners(model: Any) -> dict[str, str]:
    """Each buffer's name, and the class of the module holding it ("BatchNorm2d", or "BatchNorm" for
    any subclass of torch's BatchNorm base: SyncBatchNorm, Horovod's, a program's own)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    owners = {}
    for prefix, module in model.named_modules():
        kind = "BatchNorm" if isinstance(module, _BatchNorm) else type(module).__name__
        for name, _ in module.named_buffers(recurse=False):
            owners[f"{prefix}.{name}" if prefix else name] = kind
    return owners


def find_trained_model(torch: Any, optimizers: list[Any]) -> Any:
    """The smallest module holding every parameter the optimizers update: the model, not its DDP wrapper.

    A wrapper (DDP, torch.compile) holds the same parameters as the model plus one module, itself;
    so among the modules that hold them all, the one with the fewest submodules is the model.
    Found once, at an optimizer's first step, and kept: by exit the program may have dropped it.
    """
    import gc

    wanted = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
    module_type = torch.nn.Module
    best, best_key = None, None
    for candidate in gc.get_objects():
        if not issubclass(type(candidate), module_type):  # type(), not isinstance: no proxy's __class__ runs
            continue
        held = {id(p) for p in candidate.parameters()}
        covered = len(wanted & held)
        if not covered:
            continue
        key = (-covered, sum(1 for _ in candidate.modules()), len(held))
        if best_key is None or key < best_key:
            best, best_key = candidate, key
    return best


# ----------------------------------------------------------------------------------------- files


def _json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":")).encode()


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(data)
    _os_replace(temporary, path)
