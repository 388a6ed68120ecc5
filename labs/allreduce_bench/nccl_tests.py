"""The benchmark's table in nccl-tests' exact layout (`--format nccl-tests`), for scripts that parse it.

The layout, as nccl-tests (src/util.cu, src/common.cu) prints it without per-iteration timing:
three `#` header lines (a banner naming out-of-place and in-place, the column names, their units),
one line per size with 13 whitespace-separated fields

    size  count  type  redop  root  time algbw busbw #wrong (out-of-place)  time algbw busbw #wrong (in-place)

then `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    : X`, the mean busbw over
every time measured, both halves of every line. Widths: size and count 12, type 8, redop and root
6, time 7, algbw and busbw 6, #wrong 6, two spaces between fields. A number too wide for its
field drops decimals (2, 1, 0), then goes to exponent form.

Only what was measured is printed. A half the lab did not time (torch.distributed's all_reduce has
no out-of-place form; `--mode` picked one half) prints N/A in each of its four fields, nccl-tests'
own mark for a value it did not produce (its #wrong under -c 0): the line keeps its 13 fields, and
a script reading that time as a number fails instead of reading a neighbouring column.
"""

from __future__ import annotations

from labs.collectives.primitives import MODES, Primitive

# nccl-tests' type names (src/common.cu, test_typenames), for the dtypes the benchmark has.
TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double"}
NA = "N/A"
PREAMBLE = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
HEADER = "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}"  # "# " takes 2 of the size column's 12
HALF = "  {:>7}  {:>6}  {:>6}  {:>6}"


def fixed(value: float, width: int) -> str:
    """A number in `width` characters, as nccl-tests fits its times and bandwidths."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def count_column(primitive: Primitive, count: int, world_size: int) -> int:
    """nccl-tests' count is the count argument of the call: per rank for the chunked collectives
    (all-gather sends count/n, reduce-scatter receives count/n, all-to-all moves count/n per peer)."""
    return count // world_size if primitive.layout in ("gather", "scatter", "split") else count


def header(primitive: Primitive, backend: str, world_size: int, dtype: str, warmup_iters: int, iters: int,
           check: bool, unavailable: dict[str, str | None]) -> str:
    """`unavailable`: why a mode is not timed (None: timed); a mode missing from it was not asked for."""
    not_timed = {mode: unavailable.get(mode, "not asked for (--mode)") for mode in MODES}
    return "\n".join([
        f"# distlab allreduce_bench, nccl-tests layout: {primitive.name}, backend {backend}, world size "
        f"{world_size}, {TYPE_NAMES[dtype]}, warm-up iters: {warmup_iters} iters: {iters} validation: {int(check)}",
        *[f"# {mode}: {NA}: {reason}" for mode, reason in not_timed.items() if reason],
        "#",
        HEADER.format("", "", "", "", "") + "           out-of-place                       in-place",
        HEADER.format("size", "count", "type", "redop", "root") + HALF.format("time", "algbw", "busbw", "#wrong") * 2,
        HEADER.format("(B)", "(elements)", "", "", "") + HALF.format("(us)", "(GB/s)", "(GB/s)", "") * 2,
    ])


def line(primitive: Primitive, row: dict, world_size: int) -> str:
    text = PREAMBLE.format(row["size"], count_column(primitive, row["count"], world_size), TYPE_NAMES[row["type"]],
                           row["redop"], row["root"])
    for mode in MODES:  # nccl-tests' order: out-of-place, then in-place
        measured = row.get(mode, {"na": "not asked for (--mode)"})
        if "time_us" not in measured:
            text += HALF.format(NA, NA, NA, NA)
            continue
        wrong = NA if measured["wrong"] is None else f"{measured['wrong']:g}"
        text += HALF.format(fixed(measured["time_us"], 7), fixed(measured["algbw_gbps"], 6),
                            fixed(measured["busbw_gbps"], 6), wrong)
    return text


def footer(rows: list[dict], check: bool) -> str:
    """Out-of-bounds count and average busbw of one collective's lines."""
    measured = [row[mode] for row in rows for mode in MODES if "time_us" in row.get(mode, {})]
    wrong = sum(m["wrong"] or 0 for m in measured)
    busbw = [m["busbw_gbps"] for m in measured]
    verdict = f"{wrong} {'FAILED' if wrong else 'OK'}" if check else NA
    average = f"{sum(busbw) / len(busbw):g}" if busbw else NA
    return "\n".join([f"# {'Out of bounds values':<20} : {verdict}", f"# {'Avg bus bandwidth':<20} : {average}",
                      "#"])
