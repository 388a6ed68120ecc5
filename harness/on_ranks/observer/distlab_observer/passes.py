"""What the observer records of one pass over a DataLoader (PassRecorder), and the samples a batch holds
(batch_rows): the hooks that feed them are hooks.py's."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from . import originals
from .digests import pass_digest


class PassRecorder:
    """One pass over one DataLoader as it happens: the indices it handed out, batch by batch."""

    __slots__ = ("loader", "dataset", "dataset_len", "sampler", "indices", "batch_lengths", "yielded",
                 "steps_start", "steps_end", "non_integer", "started", "images_yielded", "step_times",
                 "step_images", "now", "batch_rows", "announced", "iterator")

    def __init__(self, loader: int, dataset: int, dataset_len: int | None, sampler: str, steps: int,
                 now: Callable[[], float] = originals._clock) -> None:
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
