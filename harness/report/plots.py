"""Every plot the harness draws, as PNG files beside the reports: one matplotlib setup for all.

Grades: accuracy per epoch, throughput and efficiency per world size. Scaling studies: throughput
(95% CI), speedup (with the Amdahl fit) and efficiency, each beside its ideal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.verdict.stats import amdahl_speedup, efficiency, mean_ci
from harness.verdict.verdicts import Sample, sample_metric


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only: servers and CI have no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grade_plots(done: dict[tuple[str, int], list[Sample]], out: Path,
                single_device: dict[str, str] | None = None) -> list[Path]:
    """Accuracy per epoch (as the programs reported it), throughput (the harness's own timing where it
    timed the run) and efficiency per world size. `single_device`: row -> the row whose world size 1
    stands for its own (the profile's single_device), the T(1) of its efficiency."""
    single_device = single_device or {}
    plt = pyplot()
    written = []
    curves = [(lab, ws, s.record["metrics"]["test_accuracy"]) for (lab, ws), samples in sorted(done.items())
              for s in samples[:1] if s.record and isinstance(s.record.get("metrics", {}).get("test_accuracy"), list)]
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for lab, ws, accuracy in curves:
            ax.plot(range(1, len(accuracy) + 1), accuracy, marker="o", label=f"{lab} ws={ws}")
        ax.set(xlabel="epoch", ylabel="test accuracy", title="Accuracy per epoch, as each program reported it")
        ax.legend(fontsize="small")
        written.append(save(fig, out / "accuracy.png"))
    series = throughput_series(done, single_device)
    if series:
        fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
        for lab, (sizes, means, errors, efficiencies, label) in series.items():
            ax_t.errorbar(sizes, means, yerr=errors, marker="o", capsize=3, label=lab)
            if efficiencies:
                ax_e.plot(sizes, efficiencies, marker="o", label=label)
        ax_t.set(xlabel="world size", ylabel="images/s (total)", title="Throughput (95% CI)")
        ax_e.axhline(1.0, color="grey", linestyle="--", label="ideal")
        ax_e.set(xlabel="world size", ylabel="efficiency T(n)/(n T(1))", title="Scaling efficiency", ylim=(0, 1.2))
        for ax in (ax_t, ax_e):
            ax.legend(fontsize="small")
        written.append(save(fig, out / "throughput.png"))
    return written


def throughput_series(done: dict[tuple[str, int], list[Sample]], single_device: dict[str, str]
                      ) -> dict[str, tuple[list[int], list[float], list[float], list[float] | None, str]]:
    """Per lab: world sizes, mean img/s (the harness's timing where it timed the run, never a claim in
    its place), their 95% half-widths, efficiency T(n) / (n T(1)) with T(1) its own world size 1 or
    else its single_device row's (None without either), and the label of that efficiency curve."""
    throughput: dict[str, dict[int, Any]] = {}
    for (lab, ws), samples in done.items():
        values = [v for s in samples
                  if s.status == "ok" and isinstance(v := sample_metric(s, "img_per_sec"), (int, float))]
        if values:
            throughput.setdefault(lab, {})[ws] = mean_ci([float(v) for v in values])
    series = {}
    for lab in sorted(throughput):
        sizes = sorted(throughput[lab])
        means = [throughput[lab][ws].mean for ws in sizes]
        base_row = lab if 1 in throughput[lab] else single_device.get(lab, "")
        base = throughput.get(base_row, {}).get(1)
        efficiencies = [efficiency(m, ws, base.mean) for m, ws in zip(means, sizes, strict=True)] if base else None
        series[lab] = (sizes, means, [throughput[lab][ws].half_width for ws in sizes], efficiencies,
                       lab if base_row == lab else f"{lab} (T(1): {base_row})")
    return series


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path



def scale_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    """Throughput (with its 95% CI), speedup (with the Amdahl fit) and efficiency against world size,
    each beside its ideal: linear scaling from the baseline."""
    rows = summary["rows"]
    sizes = [r["world_size"] for r in rows]
    base_size = sizes[0]
    base = rows[0]["img_per_sec"]["mean"]
    throughput = [r["img_per_sec"]["mean"] for r in rows]
    errors = [(r["img_per_sec"]["ci95_high"] - r["img_per_sec"]["ci95_low"]) / 2 for r in rows]
    fit = None
    serial = summary["amdahl_serial_fraction"]
    if serial is not None:
        # A smooth curve between the measured sizes: the law's shape, not just its values where measured.
        grid = [base_size + (sizes[-1] - base_size) * i / 50 for i in range(51)]
        fit = (f"Amdahl, serial fraction {serial:.3f}", grid,
               [amdahl_speedup(n, serial) / amdahl_speedup(base_size, serial) for n in grid])
    title = f"{summary['lab']} ({summary['backend']}), {summary['mode']} scaling"
    return [
        plot(out / "throughput.png", sizes, throughput, [base * n / base_size for n in sizes],
             "images/s, all ranks (95% CI)", f"Throughput: {title}", errors=errors),
        plot(out / "speedup.png", sizes, [r["speedup"] for r in rows], [n / base_size for n in sizes],
             f"speedup vs world size {base_size}", f"Speedup: {title}", fit=fit),
        plot(out / "efficiency.png", sizes, [r["efficiency"] for r in rows], [1.0] * len(sizes),
             "efficiency T(n) / (n T(1))" if base_size == 1 else f"efficiency vs world size {base_size}",
             f"Efficiency: {title}"),
    ]


def plot(path: Path, sizes: list[int], measured: list[float], ideal: list[float], ylabel: str, title: str,
         errors: list[float] | None = None, fit: tuple[str, list[float], list[float]] | None = None) -> Path:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    ax.plot(sizes, ideal, color="grey", linestyle="--", label="ideal (linear)")
    ax.errorbar(sizes, measured, yerr=errors, marker="o", capsize=3, label="measured")
    if fit:
        label, fit_sizes, fit_values = fit
        ax.plot(fit_sizes, fit_values, color="tab:orange", linestyle=":", linewidth=2, label=label)
    ax.set(xlabel="world size (ranks)", ylabel=ylabel, title=title, xticks=sizes)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return save(fig, path)



def time_split_plot(summary: dict[str, Any], out: Path) -> Path | None:
    """Per world size, one step split into compute (the step without gradient sync) and the
    communication it waits for, beside the all-reduce timed alone: the gap is what overlap hid.
    None when the lab did not report the split."""
    rows = summary["rows"]
    if not rows or any(r.get(k) is None for r in rows for k in ("step_seconds_no_sync", "comm_seconds",
                                                                 "allreduce_seconds")):
        return None
    labels = [str(r["world_size"]) for r in rows]
    compute = [r["step_seconds_no_sync"] * 1e3 for r in rows]
    comm = [max(0.0, r["comm_seconds"]) * 1e3 for r in rows]  # below 0 only by noise: nothing waited for
    alone = [r["allreduce_seconds"] * 1e3 for r in rows]
    fig, ax = pyplot().subplots(figsize=(6, 4))
    ax.bar(labels, compute, label="compute (step, no sync)")
    ax.bar(labels, comm, bottom=compute, label="communication waited for")
    ax.scatter(labels, [c + a for c, a in zip(compute, alone, strict=True)], marker="_", s=400, color="black",
               zorder=3, label="compute + all-reduce alone (no overlap)")
    ax.set(xlabel="world size (ranks)", ylabel="ms per step",
           title=f"Compute vs communication: {summary['lab']} ({summary['backend']}), {summary['mode']}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return save(fig, out / "compute_comm.png")
