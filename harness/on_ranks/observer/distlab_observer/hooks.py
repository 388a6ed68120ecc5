"""The hooks the observer arms on torch's entry points, once torch and horovod.torch load: the process
group, the DataLoader iterator, the optimizers' steps, torch.save and torch.load (and os.replace and
os.rename, which a checkpoint is renamed into place with). Each notes what it saw (observed.py) after
the program's function returned, unchanged."""

from __future__ import annotations

import functools
import os
import sys
import weakref
from typing import Any

from . import originals
from .fileformat import RANK_FILE, STOP_EXIT_CODE, STOPPED_DIR
from .model import _params_digest, find_trained_model
from .output import Output
from .passes import PassRecorder, batch_rows

# A stopped rank's wait for the others' stopped observations: the ranks reach the stop together (the
# backward pass's all-reduce precedes the step), so seconds on a busy machine; bounded for a rank that never does.
STOP_WAIT_S = 60.0

# The optimizer steps after which each rank digests the parameters the optimizers update: the
# replicas must be equal after every step of a data-parallel run, not only at the end (a program that
# trains each rank alone and broadcasts rank 0's state after each epoch ends with equal replicas).
# Powers of two: a few digests whatever the run's length (a ResNet-18's 45 MB, about 0.1 s each).
SAMPLED_STEPS = tuple(2 ** k for k in range(24))
LOADS_KEPT = 100  # torch.loads of files noted per rank


class Hooks(Output):
    """The hooks of the observer (Observer's: observer.py)."""

    def on_torch(self, torch: Any) -> None:
        self.reached("torch_imported")  # before our own hooks: their cost is the observer's, not torch's
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
            self.reached("process_group_called")
            result = original(*args, **kwargs)
            self.reached("process_group")
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
            self.reached("process_group_called")
            result = original(*args, **kwargs)
            self.reached("process_group")
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
                self.reached("first_batch")
                current[1].yielded_batch()
                current[1].batch_rows = self.guard("batch rows", batch_rows, self.torch, batch)
                self.last_batch_from = current[1]
            if ended:
                self.guard("pass line", self.announce, current[1])

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
            self.reached("last_step", again=True)
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
                began = originals._clock()
                found = self.guard("parameters at a step", _params_digest, torch, self.optimizers)
                if found is not None:
                    self.params_at_steps[str(self.steps)] = found
                self.paused += originals._clock() - began

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
        self._wait_for_the_other_ranks()
        os._exit(STOP_EXIT_CODE)  # no handler of the program runs: the rank ends as a killed one would

    def _wait_for_the_other_ranks(self) -> None:
        """Exit only once every rank's stopped observations are written (or STOP_WAIT_S passed): torchrun
        answers the first rank to exit by ending the others, and a rank still writing its file then
        leaves none. On a busy machine one rank reached the stop a moment after another had exited
        (CI: "rank 0 of the stopped attempt left no observations"). The directory is the run's, shared
        by its ranks; where it is not (one per host), the wait ends at STOP_WAIT_S."""
        world = os.environ.get("WORLD_SIZE", "")
        if not world.isdigit():
            return
        directory = os.path.join(self.directory, STOPPED_DIR)
        expected = {RANK_FILE.format(rank=r) for r in range(int(world))}
        deadline = originals._clock() + STOP_WAIT_S
        while originals._clock() < deadline:
            try:
                if expected <= set(os.listdir(directory)):
                    return
            except OSError:
                return
            originals._sleep(0.05)

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
