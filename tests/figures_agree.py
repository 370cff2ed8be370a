"""Do a notebook's measured figures agree with each other? Checks on printed text.

Each check reads the text outputs of a notebook's cells (by cell id) and returns
what is wrong, as sentences; none when the figures agree. Three kinds:

- **printed twice**: one quantity printed by two cells (or twice by one) shows the
  same digits both times, since it is the same run;
- **measured twice**: the same quantity measured in two cells of one notebook agrees
  within a stated factor (the reason for each factor is given where it is set);
- **concluded**: a conclusion a cell prints is the one its printed figures imply,
  worked out again here from those figures with the rule the cell states.

``tests/test_figures_agree.py`` runs them on the stored outputs. To check a fresh
recording before it is stored, execute copies of the notebooks and run this file on
them (one notebook at a time on a small machine)::

    cd notebooks && jupyter nbconvert --to notebook --execute \\
        01_single_node_multi_gpu.ipynb \\
        --output /tmp/fresh/01_single_node_multi_gpu.ipynb
    python tests/figures_agree.py /tmp/fresh/01_single_node_multi_gpu.ipynb

or ``FIGURES_FROM=/tmp/fresh pytest tests/test_figures_agree.py`` (the folder holds
copies whose names start with the notebook's number, ``01...ipynb``; a notebook
missing there is skipped).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CAUSE = (
    "A stored output recorded on a busy machine, or a cell re-run alone, is the usual "
    "cause: re-record the notebook whole with make record."
)
NUM = r"-?\d[\d,]*(?:\.\d+)?"

Outputs = dict[str, str]


def outputs_of(path: Path) -> Outputs:
    """``{cell id: the cell's text outputs, joined}`` of one notebook file."""
    cells = {}
    for cell in json.loads(Path(path).read_text())["cells"]:
        text = ""
        for out in cell.get("outputs", []):
            if "text" in out:
                text += "".join(out["text"])
            text += "".join(out.get("data", {}).get("text/plain", ""))
        cells[cell.get("id", "")] = text
    return cells


def num(text: str) -> float:
    return float(text.replace(",", ""))


class Missing(Exception):
    """A printed label a check reads is not in the cell's output."""


def find(outputs: Outputs, cell: str, pattern: str, flags: int = 0) -> re.Match:
    """The first match of ``pattern`` in ``cell``'s output, or Missing naming both."""
    text = outputs.get(cell)
    if text is None:
        raise Missing(f"the notebook has no cell {cell}")
    match = re.search(pattern, text, flags)
    if match is None:
        raise Missing(
            f"cell {cell} prints nothing matching {pattern!r} (its output begins "
            f"{text[:120]!r}); the cell or its label changed, or it was not re-recorded"
        )
    return match


def find_all(outputs: Outputs, cell: str, pattern: str, flags: int = 0) -> list:
    found = re.findall(pattern, outputs.get(cell, ""), flags)
    if not found:
        find(outputs, cell, pattern, flags)  # raises with the message
    return found


def within(a: float, b: float, factor: float) -> bool:
    """``a`` and ``b`` are both positive and neither is more than ``factor`` times
    the other."""
    return a > 0 and b > 0 and max(a, b) <= factor * min(a, b)


def verdict(ratio: float) -> str:
    """The rule of ``workshop.lessons.verdicts``: 5% either way of 1 is "about as
    fast", read from the ratio as printed (two decimals)."""
    if ratio >= 1.05:
        return "faster"
    if ratio <= 0.95:
        return "slower"
    return "about as fast"


# ------------------------------------------------------------------ notebook 01
HISTORY_ROW = re.compile(r"^ +(\d+) +(\d\.\d{3}) +(\d\.\d{3}) +(\d\.\d{3})(.*)$", re.M)


def nb01_history_printed_twice(o: Outputs) -> list[str]:
    """656ce1cd trains once and prints its history as it goes, then as a table;
    4948d744 prints the same history with times: every loss and accuracy the same."""
    streamed = find_all(
        o,
        "656ce1cd",
        r"epoch (\d+)/\d+ +loss (\d\.\d{3}) +accuracy (\d\.\d{3}) +eval accuracy "
        r"(\d\.\d{3})",
    )
    table = [r[:4] for r in HISTORY_ROW.findall(o["656ce1cd"])]
    timed = [r[:4] for r in HISTORY_ROW.findall(o.get("4948d744", ""))]
    if not timed:
        raise Missing("cell 4948d744 prints no history rows")
    problems = []
    if table != streamed:
        problems.append(
            f"cell 656ce1cd's table {table} is not what it printed epoch by epoch "
            f"{streamed}"
        )
    if timed != table:
        problems.append(
            f"the same history printed twice differs: cell 656ce1cd {table}, cell "
            f"4948d744 {timed}"
        )
    return problems


def _baseline_rate(o: Outputs) -> float:
    """The single-device baseline's samples/s (cell 4948d744): the median of the
    epochs after the first, which pays one-time costs."""
    rows = HISTORY_ROW.findall(o.get("4948d744", ""))
    rates = sorted(num(r[4].split()[0]) for r in rows[1:] if r[4].split())
    if not rates:
        raise Missing("cell 4948d744 prints no samples/s after its first epoch")
    return rates[len(rates) // 2]


# SmallCNN on the same digits loader (batch 64), the same machine, a few epochs apart
# in one recording: on a quiet machine their samples/s agree within tens of percent.
# Twice the one or the other is what a busy machine, or a cell re-run alone, does.
SAME_MODEL_AND_LOADER = 2.0


def nb01_fp32_against_baseline(o: Outputs) -> list[str]:
    """7ab641e4's fp32 epoch against the baseline's (same SmallCNN, same loader)."""
    fp32 = num(
        find(o, "7ab641e4", rf"fp32 *: loss per epoch .*?, ({NUM}) samples/s")[1]
    )
    base = _baseline_rate(o)
    if within(fp32, base, SAME_MODEL_AND_LOADER):
        return []
    return [
        f"SmallCNN in fp32 trains at {fp32:,.0f} samples/s in cell 7ab641e4 but "
        f"{base:,.0f} in the baseline (cell 4948d744): same model and loader, more "
        f"than {SAME_MODEL_AND_LOADER}x apart"
    ]


RATIO_LINE = (
    rf"(?P<label>[^\n:]+): (?P<rate>{NUM}) (?P<unit>\S+), (?P<ratio>\d+\.\d\d)x "
    rf"(?P<base>[^\n']+)'s (?P<base_rate>{NUM}): (?P<verdict>faster|slower|about as "
    r"fast) here"
)


def _ratio_line(o: Outputs, cell: str, label: str) -> list[str]:
    """A rate_ratio line: its ratio is its two rates' and its verdict the rule's."""
    m = find(o, cell, rf"(?m)^{re.escape(label)}: .*$")
    m = re.match(RATIO_LINE, m[0])
    if m is None:
        raise Missing(f"cell {cell}'s line for {label!r} is not a ratio line")
    rate, base, ratio = num(m["rate"]), num(m["base_rate"]), float(m["ratio"])
    problems = []
    # The rates are printed whole: their ratio is known to 1 part in the smaller.
    if (
        base <= 0
        or abs(rate / base - ratio) > 0.005 + (0.5 / base + 0.5 / rate) * ratio
    ):
        problems.append(
            f"cell {cell}: {rate:,.0f} / {base:,.0f} is not the printed {ratio:.2f}x"
        )
    if m["verdict"] != verdict(ratio):
        problems.append(
            f"cell {cell} concludes {m['verdict']!r} from {ratio:.2f}x; the rule "
            f"(5% either way of 1) gives {verdict(ratio)!r}"
        )
    return problems


def nb01_bf16_conclusion(o: Outputs) -> list[str]:
    """7ab641e4's verdict on bf16 against fp32, from the two rates it printed."""
    problems = _ratio_line(o, "7ab641e4", "bf16")
    printed = {
        k: num(v)
        for k, v in re.findall(rf"(fp32|bf16) *: loss per epoch .*?, ({NUM}) samples/s",
                               o["7ab641e4"])
    }  # fmt: skip
    line = re.search(RATIO_LINE, o["7ab641e4"])
    if line and (num(line["rate"]), num(line["base_rate"])) != (
        printed.get("bf16"),
        printed.get("fp32"),
    ):
        problems.append(
            f"cell 7ab641e4's verdict reads {line['rate']} and {line['base_rate']} "
            f"samples/s, its lines above print {printed}"
        )
    return problems


COMPILE_CELLS = [f"c0a1e5d{i}" for i in range(1, 10)]


def _compile_text(o: Outputs) -> tuple[str, str]:
    for cell in COMPILE_CELLS:
        if re.search(r"eager:? +[\d,]+ samples/s", o.get(cell, "")):
            return cell, o[cell]
    raise Missing(
        f"none of cells {COMPILE_CELLS[0]}..{COMPILE_CELLS[-1]} prints "
        "'eager: N samples/s' (the compile lesson's eager epoch)"
    )


def nb01_compile_eager_against_baseline(o: Outputs) -> list[str]:
    """The compile lesson's eager epoch against the baseline: the same SmallCNN and
    loader, so the same rate within SAME_MODEL_AND_LOADER (issue 45: 283 against
    2,131 to 2,840 samples/s, a busy machine's figure taught a false lesson)."""
    cell, text = _compile_text(o)
    eager = num(re.search(r"eager:? +([\d,]+) samples/s", text)[1])
    base = _baseline_rate(o)
    if within(eager, base, SAME_MODEL_AND_LOADER):
        return []
    return [
        f"the compile lesson's eager epoch runs at {eager:,.0f} samples/s "
        f"(cell {cell}), "
        f"the baseline at {base:,.0f} (cell 4948d744): same model and loader, more "
        f"than {SAME_MODEL_AND_LOADER}x apart"
    ]


BREAK_EVEN = re.compile(
    rf"(?m)^(?P<where>[^\n:]*): eager (?P<eager>{NUM}) ms a step, compiled "
    rf"(?P<compiled>{NUM}) ms\n\s+(?:the warm-up of (?P<warmup>{NUM}) s pays off "
    rf"after (?P<steps>{NUM}) steps, (?P<seconds>{NUM}) s of eager training"
    r"|(?P<never>compiled is not faster here))"
)


def nb01_break_even(o: Outputs) -> list[str]:
    """Every break-even summary: steps = warm-up / (eager - compiled step), and
    "never" only where the compiled step is not shorter."""
    problems, seen = [], 0
    for cell in COMPILE_CELLS:
        for m in BREAK_EVEN.finditer(o.get(cell, "")):
            seen += 1
            eager, compiled = num(m["eager"]), num(m["compiled"])
            if m["never"]:
                if compiled < eager - 0.1:  # the step times are printed to 0.1 ms
                    problems.append(
                        f"cell {cell} says compiling never pays off, with a compiled "
                        f"step of {compiled} ms against {eager} ms eager"
                    )
                continue
            warmup, steps = num(m["warmup"]), num(m["steps"])
            saved = (eager - compiled) / 1e3
            if saved <= 0:
                problems.append(f"cell {cell} gives a break-even, with nothing saved")
                continue
            # Each figure is rounded as printed: 0.05 s, 0.05 ms.
            low = (warmup - 0.05) / (saved + 1e-4)
            high = (warmup + 0.05) / max(saved - 1e-4, 1e-9)
            if not low - 0.5 <= steps <= high + 0.5:
                problems.append(
                    f"cell {cell}: a warm-up of {warmup} s over ({eager} - {compiled}) "
                    f"ms a step is {warmup / saved:,.0f} steps, not the printed "
                    f"{steps:,.0f}"
                )
            if (
                abs(num(m["seconds"]) - steps * eager / 1e3)
                > 0.5 + 0.01 * steps * eager / 1e3
            ):
                problems.append(
                    f"cell {cell}: {steps:,.0f} eager steps of {eager} ms are "
                    f"{steps * eager / 1e3:,.0f} s, not the printed {m['seconds']} s"
                )
    if not seen:
        raise Missing("no cell of the compile lesson prints a break-even summary")
    return problems


# One epoch's rate against its own step: the same run, but the epoch also holds the
# first (compiling or warming) step and a short last batch: within 1.5x.
SAME_RUN_EPOCH_AND_STEP = 1.5


def nb01_compile_step_against_epoch(o: Outputs) -> list[str]:
    """The eager step of the break-even summary against the eager epoch's rate: the
    same run, batches of 64."""
    cell, text = _compile_text(o)
    eager_rate = num(re.search(r"eager:? +([\d,]+) samples/s", text)[1])
    for other in COMPILE_CELLS:
        m = BREAK_EVEN.search(o.get(other, ""))
        if m and "H100" not in m["where"]:  # the published figures are not this run
            step_rate = 64 / (num(m["eager"]) / 1e3)
            if within(eager_rate, step_rate, SAME_RUN_EPOCH_AND_STEP):
                return []
            return [
                f"the eager epoch runs at {eager_rate:,.0f} samples/s (cell {cell}) "
                f"but "
                f"its step of {m['eager']} ms (cell {other}) is {step_rate:,.0f} "
                f"samples/s: the same run, more than {SAME_RUN_EPOCH_AND_STEP}x apart"
            ]
    raise Missing("no break-even summary of this machine's eager step")


FIT = re.compile(
    rf"(?m)^(?P<name>[^\n:]+): fixed (?P<f>{NUM}) ms per step \+ "
    rf"(?P<p>{NUM}) ms per sample"
)
SHARES = re.compile(
    r"(?m)^(?P<name>[^\n:]+): fixed share (?P<shares>.*) device\(s\)\n"
    r"\s+no number of devices can beat x(?P<limit>\S+)"
)


def _share_bounds(f: float, p: float, n: int) -> tuple[float, float]:
    """The fixed share of a batch of 64 on n devices, over the fit's printed rounding
    (0.05 ms fixed, 0.005 ms per sample)."""
    f_lo, f_hi, p_lo, p_hi = max(f - 0.05, 0), f + 0.05, max(p - 0.005, 0), p + 0.005
    return f_lo / (f_lo + p_hi * 64 / n), f_hi / (f_hi + p_lo * 64 / n)


def nb01_fixed_shares(o: Outputs) -> list[str]:
    """651528ab's shares and limits are those of ce9a09b3's printed fit."""
    fits = {
        m["name"]: (num(m["f"]), num(m["p"]))
        for m in FIT.finditer(o.get("ce9a09b3", ""))
    }
    if not fits:
        raise Missing(
            "cell ce9a09b3 prints no 'fixed ... ms per step + ... ms per sample'"
        )
    problems, seen = [], 0
    for m in SHARES.finditer(o.get("651528ab", "")):
        seen += 1
        f, p = fits[m["name"]]
        for share, n in re.findall(r"(\d+)% on (\d+)", m["shares"]):
            lo, hi = _share_bounds(f, p, int(n))
            if not lo - 0.005 <= int(share) / 100 <= hi + 0.005:
                problems.append(
                    f"{m['name']}: fixed share {share}% on {n} (cell 651528ab), but "
                    f"the "
                    f"fit of cell ce9a09b3 ({f} ms + {p} ms x 64/{n}) gives "
                    f"{lo:.1%} to {hi:.1%}"
                )
        lo, hi = _share_bounds(f, p, 1)
        limit = m["limit"]
        if limit != "inf" and not (
            1 / hi - 0.05 <= float(limit) <= (1 / lo if lo else 1e9) + 0.05
        ):
            problems.append(
                f"{m['name']}: limit x{limit} (cell 651528ab) is not 1 / the fixed "
                f"share "
                f"on one device, {lo:.1%} to {hi:.1%}"
            )
    if seen != len(fits):
        raise Missing(
            f"cell 651528ab prints shares for {seen} models, the fit {len(fits)}"
        )
    return problems


def nb01_fitted_step_against_baseline(o: Outputs) -> list[str]:
    """SmallCNN's fitted step at a batch of 64 (ce9a09b3) against the baseline's
    samples/s: the same model and batch; the fit times steps alone, the baseline
    also loads batches, so within SAME_MODEL_AND_LOADER."""
    fits = {
        m["name"]: (num(m["f"]), num(m["p"]))
        for m in FIT.finditer(o.get("ce9a09b3", ""))
    }
    name = next((n for n in fits if n.startswith("SmallCNN")), None)
    if name is None:
        raise Missing("cell ce9a09b3 prints no fit for SmallCNN")
    f, p = fits[name]
    fitted = 64 / ((f + 64 * p) / 1e3)
    base = _baseline_rate(o)
    if within(fitted, base, SAME_MODEL_AND_LOADER):
        return []
    return [
        f"SmallCNN's fitted step ({f} ms + 64 x {p} ms, cell ce9a09b3) is "
        f"{fitted:,.0f} samples/s, the baseline {base:,.0f} (cell 4948d744): more "
        f"than {SAME_MODEL_AND_LOADER}x apart"
    ]


def nb01_profile_leader(o: Outputs) -> list[str]:
    """6b03f62f says whether a convolution leads: it does iff the first row's name
    holds 'conv'."""
    first = find(o, "6b03f62f", r"(?m)^(\S+) +\d+ calls")[1]
    said = find(o, "6b03f62f", r"a convolution leads the table: (True|False)")[1]
    if said == str("conv" in first):
        return []
    return [f"cell 6b03f62f leads with {first} and says a convolution leads: {said}"]


# ------------------------------------------------------------------ notebook 02
def nb02_history_printed_twice(o: Outputs) -> list[str]:
    """64c69033 streams rank 0's epochs; 25c091ca prints the same history."""
    streamed = find_all(
        o,
        "64c69033",
        r"epoch (\d+)/\d+ +loss (\d\.\d{3}) +accuracy (\d\.\d{3}) +eval accuracy "
        r"(\d\.\d{3})",
    )
    table = [r[:4] for r in HISTORY_ROW.findall(o.get("25c091ca", ""))]
    if table == streamed:
        return []
    return [
        f"one DDP run printed twice differs: cell 64c69033 {streamed}, "
        f"cell 25c091ca {table}"
    ]


def nb02_plain_script_ranks_agree(o: Outputs) -> list[str]:
    """1d043622: the markdown says both ranks end with the same weights, to the last
    digit printed."""
    sums = find_all(o, "1d043622", rf"rank \d: weights sum to ({NUM})")
    if len(set(sums)) == 1 and len(sums) == 2:
        return []
    return [f"cell 1d043622's ranks print weight sums {sums}: not one figure twice"]


def nb02_bucket_trend(o: Outputs) -> list[str]:
    """2bffeb69's verdict: a trend only when the times move one way with the cap at
    every row, by more than twice the difference of caps with equal buckets."""
    rows = [
        (float(c), int(b), float(ms))
        for c, b, ms in find_all(o, "2bffeb69", r"(?m)^ +([\d.]+) +(\d+) +([\d.]+) ms$")
    ]
    said = find(o, "2bffeb69", r"a trend with the bucket size: (yes|no)")[1]
    groups: dict[int, list[float]] = {}
    for _, b, ms in rows:
        groups.setdefault(b, []).append(ms)
    same = [max(v) - min(v) for v in groups.values() if len(v) > 1]
    ordered = [ms for _, _, ms in sorted(rows)]
    diffs = [b - a for a, b in itertools.pairwise(ordered)]
    one_way = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
    spread = max(ordered) - min(ordered)
    trend = one_way and (not same or spread > 2 * max(same))
    if said == ("yes" if trend else "no"):
        return []
    return [
        f"cell 2bffeb69 says trend {said!r} from rows {rows}; the rule gives {trend}"
    ]


SWEEP_ROW = re.compile(
    rf"(?m)^ +(\d+) +\d+ +float32 +\d+ +({NUM}) +({NUM}) +({NUM}) +({NUM}) +([-+]\d+)%$"
)


def nb02_allreduce_summary(o: Outputs) -> list[str]:
    """8ab09777's summary: the worst error and its verdict, and the peak busbw's
    share of the memory copy, from the table above it."""
    rows = SWEEP_ROW.findall(o.get("8ab09777", ""))
    if not rows:
        raise Missing("cell 8ab09777 prints no sweep rows")
    worst = max(abs(int(r[5])) for r in rows)
    verdict_line = (
        r"the model (predicts|does NOT predict) every measured size within (\d+)%: "
        r"worst error ([\d.]+)%"
    )
    m = find(o, "8ab09777", verdict_line)
    problems = []
    if abs(float(m[3]) - worst) > 0.5:
        problems.append(
            f"cell 8ab09777: worst error {m[3]}%, its rows' worst is {worst}%"
        )
    if (m[1] == "predicts") != (float(m[3]) <= float(m[2])):
        problems.append(
            f"cell 8ab09777 says the model {m[1]} within {m[2]}% with a worst "
            f"error of {m[3]}%"
        )
    peak = max(num(r[3]) for r in rows)
    b = find(
        o,
        "8ab09777",
        rf"peak busbw ({NUM}) GB/s = ([\d.]+)% of the reference: .* at ({NUM}) GB/s",
    )
    if abs(num(b[1]) - peak) > 0.0005:
        problems.append(f"cell 8ab09777: peak busbw {b[1]}, its rows' peak {peak}")
    if abs(num(b[1]) / num(b[3]) * 100 - float(b[2])) > 0.1:
        problems.append(f"cell 8ab09777: {b[1]} / {b[3]} GB/s is not {b[2]}%")
    return problems


SCALING_ROW = re.compile(
    rf"(?m)^(weak|strong) +(\d+) +(\d+) +({NUM}) +([\d.]+) +(\d+)% +({NUM}) +({NUM}) "
    rf"+({NUM}) +(\S+) +({NUM})$"
)


def scaling_rows(text: str) -> list[dict]:
    keys = ["mode", "ranks", "batch", "rate", "speedup", "eff", "step", "compute",
            "comm", "pred", "flight"]  # fmt: skip
    rows = []
    for r in SCALING_ROW.findall(text):
        row = dict(zip(keys, r, strict=True))
        rows.append(
            {k: (v if k in ("mode", "pred") else num(v)) for k, v in row.items()}
        )
    return rows


# The report's own check: weak and strong rows that did the same work (same ranks,
# same batch per rank) and took more than 1.25x each other's time were measured on
# a busy machine (ScalingResult._noise prints a `check:` line).
SAME_WORK = 1.25


def check_scaling_table(cell: str, text: str) -> list[str]:
    """Speed-ups and efficiencies as the table defines them, comm = step - compute
    floored at 0, equal work in equal time, and the verdict lines under it."""
    rows = scaling_rows(text)
    if not rows:
        raise Missing(f"cell {cell} prints no scaling rows")
    problems = []
    for mode in ("weak", "strong"):
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        base = min(mine, key=lambda r: r["ranks"])
        for r in mine:
            if mode == "weak":
                speedup = r["rate"] / base["rate"]
                slack = 0.5 / base["rate"] + 0.5 / r["rate"]
            else:
                speedup = base["step"] / r["step"]
                slack = 0.05 / base["step"] + 0.05 / r["step"]
            if abs(speedup - r["speedup"]) > 0.005 + slack * speedup:
                problems.append(
                    f"cell {cell}: {mode} {r['ranks']} ranks prints speed-up "
                    f"{r['speedup']}, its figures give {speedup:.3f}"
                )
            eff = r["speedup"] * base["ranks"] / r["ranks"] * 100
            if abs(eff - r["eff"]) > 0.5 + 0.25 * base["ranks"] / r["ranks"]:
                problems.append(
                    f"cell {cell}: {mode} {r['ranks']} ranks prints efficiency "
                    f"{r['eff']:.0f}%, speed-up x {base['ranks']}/{r['ranks']} "
                    f"gives {eff:.1f}%"
                )
            if abs(max(r["step"] - r["compute"], 0) - r["comm"]) > 0.15:
                problems.append(
                    f"cell {cell}: {mode} {r['ranks']} ranks: comm {r['comm']} is not "
                    f"step {r['step']} - compute {r['compute']} (floored at 0)"
                )
    for weak in (r for r in rows if r["mode"] == "weak"):
        for strong in rows:
            if (
                strong["mode"] == "strong"
                and (strong["ranks"], strong["batch"])
                == (
                    weak["ranks"],
                    weak["batch"],
                )
                and not within(weak["step"], strong["step"], SAME_WORK)
            ):
                problems.append(
                    f"cell {cell}: weak and strong at {weak['ranks']} rank(s) did the "
                    f"same work in {weak['step']} and {strong['step']} ms a step, more "
                    f"than {SAME_WORK}x apart"
                )
    for m in re.finditer(
        r"(weak|strong) scaling, (\d+) to (\d+) ranks: speed-up ([\d.]+), efficiency "
        r"(\d+)%: (faster than|slower than|about as fast as)",
        text,
    ):
        row = next(
            (r for r in rows if r["mode"] == m[1] and r["ranks"] == int(m[3])), None
        )
        said = m[6].rsplit(" ", 1)[0]
        if row is None or float(m[4]) != row["speedup"] or said != verdict(float(m[4])):
            problems.append(
                f"cell {cell}: '{m[0]}' is not what the table's {m[1]} row at {m[3]} "
                f"ranks gives (speed-up {row and row['speedup']}: "
                f"{verdict(float(m[4]))})"
            )
    return problems


def nb02_scaling_tables(o: Outputs) -> list[str]:
    problems = check_scaling_table("d2faec60", o.get("d2faec60", ""))
    problems += check_scaling_table("1c5426c5", o.get("1c5426c5", ""))
    if "scaling, 1 to" not in o.get("d2faec60", ""):
        raise Missing("cell d2faec60 prints no 'weak scaling, 1 to N ranks' verdict")
    return problems


# Two fits of the same ring model, on the same machine in one recording: the sweep
# (sizes to 16 MiB, 2 ranks) and the scaling run (4 sizes about the gradient's). At
# 0.38 MB the latency term dominates, and it is what a busy machine moves most:
# within 3x of each other.
SAME_RING_MODEL = 3.0


def nb02_ring_prediction_twice(o: Outputs) -> list[str]:
    """The sweep's alpha and beta (8ab09777) predict the gradient's all-reduce on 2
    ranks; the scaling run (d2faec60) predicts it with its own fit."""
    m = find(o, "8ab09777", rf"alpha = ({NUM}) us per step, beta = ({NUM}) GB/s")
    params = num(find(o, "d2faec60", rf"\(({NUM}) parameters\)")[1])
    gradient = params * 4
    sweep_ms = (2 * num(m[1]) * 1e-6 + gradient / (num(m[2]) * 1e9)) * 1e3
    preds = [float(r["pred"]) for r in scaling_rows(o["d2faec60"]) if r["ranks"] == 2]
    if not preds:
        raise Missing("cell d2faec60 prints no 2-rank row with a prediction")
    if all(within(sweep_ms, p, SAME_RING_MODEL) for p in preds):
        return []
    return [
        f"the sweep's fit (cell 8ab09777: alpha {m[1]} us, beta {m[2]} GB/s) predicts "
        f"{sweep_ms:.2f} ms for {gradient:,.0f} bytes on 2 ranks; the scaling run "
        f"(cell d2faec60) predicts {preds} ms: more than {SAME_RING_MODEL}x apart"
    ]


# ------------------------------------------------------------------ notebook 03
def nb03_same_runs_printed_again(o: Outputs) -> list[str]:
    """The 2-rank script's epochs are the same computation in 119de726 (torchrun),
    c454c3ec (the restarted job, before and after its crash) and 3ac435c3 (mpirun);
    c454c3ec's last line is printed again by 49898144."""
    epochs: dict[str, dict[str, str]] = {}
    for cell in ("119de726", "c454c3ec", "3ac435c3"):
        for e, acc in find_all(o, cell, r"epoch (\d+): eval accuracy (\d\.\d{3})"):
            epochs.setdefault(e, {})[cell] = acc
    problems = [
        f"epoch {e} of the same 2-rank run prints eval accuracy {cells}"
        for e, cells in epochs.items()
        if len(set(cells.values())) > 1
    ]
    last = find(o, "c454c3ec", rf"done: weight checksum ({NUM})")[1]
    again = find(o, "49898144", rf"restarted: done: weight checksum ({NUM})")[1]
    if last != again:
        problems.append(f"the restarted job ends with checksum {last} (cell c454c3ec), "
                        f"printed again as {again} (cell 49898144)")  # fmt: skip
    return problems


# Section 3's 4 ranks and section 9's "4 ranks, same lr", seed 0, train the same
# SmallCNN the same way (4 x 32 a step, lr 0.05, one epoch); one is started by
# torchrun, the other by workshop.launch, whose sums may round differently in the
# last bits: the same accuracy within 0.02.
SAME_TRAINING = 0.02


def nb03_section3_again_in_section9(o: Outputs) -> list[str]:
    section3 = float(find(o, "f5c1203b", r"epoch 0: eval accuracy (\d\.\d{3})")[1])
    m = find(o, "d70de7d4", r"(?m)^4 ranks, same lr .* (\d\.\d\d) \d\.\d\d \d\.\d\d$")
    if abs(float(m[1]) - section3) <= SAME_TRAINING:
        return []
    return [
        f"section 3's 4 ranks reach eval accuracy {section3} (cell f5c1203b), the same "
        f"training with seed 0 in section 9 {m[1]} (cell d70de7d4): more than "
        f"{SAME_TRAINING} apart"
    ]


def nb03_batch_verdicts(o: Outputs) -> list[str]:
    """d70de7d4's three lines, from its table."""
    runs = {
        name.strip(): (float(acc), [float(s) for s in seeds.split()])
        for name, acc, seeds in find_all(
            o,
            "d70de7d4",
            r"(?m)^(1 rank|\d+ ranks, [^\d\n]*(?:x \d+)?[^\d\n]*?)"
            r" +\d+ +\d+ +[\d.]+ +\d+ +\d+ "
            r"+(\d\.\d{3}) +((?:\d\.\d\d ?)+)$",
        )
    }
    names = list(runs)
    if len(names) < 4:
        raise Missing(f"cell d70de7d4 prints {len(names)} settings, not 4")
    (a1, _), (same, _), (warm, wseeds), (scaled, sseeds) = (runs[n] for n in names[:4])
    text, problems = o["d70de7d4"], []
    behind = "behind" if a1 - same > 0 else "not behind"
    if not re.search(rf": {behind}$", text, re.M):
        problems.append(f"cell d70de7d4: {same} against 1 rank's {a1} is {behind!r}")
    if a1 - same > 0:
        share = (scaled - same) / (a1 - same)
        m = find(o, "d70de7d4", r"recovers (-?\d+)% of that gap")
        if abs(int(m[1]) - share * 100) > 1:
            problems.append(
                f"cell d70de7d4: lr x N recovers {share:.0%}, it prints {m[1]}%"
            )
    spread = max(max(wseeds) - min(wseeds), max(sseeds) - min(sseeds))
    warm_line = (
        r"warm-up against none: ([-+][\d.]+); the seeds spread over ([\d.]+): "
        r"(within|beyond)"
    )
    m = find(o, "d70de7d4", warm_line)
    inside = abs(warm - scaled) <= spread + 0.005
    if abs(float(m[2]) - spread) > 0.005 or (m[3] == "within") != inside:
        problems.append(
            f"cell d70de7d4: warm-up {warm} against {scaled}, seeds spread "
            f"{spread:.2f}: "
            f"it prints {m[0]!r}"
        )
    return problems


def nb03_scaling_job(o: Outputs) -> list[str]:
    """f1e08da2 prints the job's own tables, then the same rows read back from its
    files: the same digits. And each table's figures agree (check_scaling_table)."""
    text = o.get("f1e08da2", "")
    if "results:" not in text:
        raise Missing("cell f1e08da2 ran no scaling job (no 'results:' line)")
    job, after = text.split("results:", 1)
    problems = []
    for line in (ln for ln in after.splitlines() if SCALING_ROW.match(ln)):
        if line not in job.splitlines():
            problems.append(
                f"cell f1e08da2 reads back {line.strip()!r}, which the job did not "
                "print"
            )
    problems += check_scaling_table("f1e08da2 (the job)", job)
    problems += check_scaling_table("f1e08da2 (read back)", after)
    if "scaling, 1 to" not in after:
        raise Missing("cell f1e08da2 prints no 'weak scaling, 1 to N ranks' verdict")
    return problems + check_scaling_table("93662175", o.get("93662175", ""))


# ------------------------------------------------------------------ notebook 04
# GPipe, 4 stages, 4 micro-batches, in two cells: the same schedule with the same
# sleeps (20 ms forward, 40 ms backward); only the sends and the clocks' alignment
# differ between runs: the idle fractions agree within 0.05.
SAME_SCHEDULE = 0.05


def nb04_gpipe_measured_twice(o: Outputs) -> list[str]:
    first = float(
        find(o, "83ccc237", r"idle: measured ([\d.]+), \(p-1\)/\(m\+p-1\) = ([\d.]+)")[
            1
        ]
    )
    row = find(o, "68954512", r"(?m)^gpipe +4 +([\d.]+) +([\d.]+) +\d+$")
    problems = []
    if abs(first - float(row[1])) > SAME_SCHEDULE:
        problems.append(
            f"GPipe 4x4 idles {first} (cell 83ccc237) and {row[1]} (cell 68954512)"
        )
    for sched, m, measured, formula in find_all(
        o, "68954512", r"(?m)^(\w+) +(\d+) +([\d.]+) +([\d.]+) +\d+$"
    ):
        if abs(float(formula) - 3 / (int(m) + 3)) > 0.005:
            problems.append(
                f"cell 68954512: {sched} m={m} formula {formula}, (p-1)/(m+p-1) "
                f"= {3 / (int(m) + 3):.2f}"
            )
        # The markdown and the key points say the measured bubble is a little above
        # the formula (sends and clocks add to it): never below it, past rounding.
        if float(measured) < float(formula) - 0.01:
            problems.append(
                f"cell 68954512: {sched} m={m} idles {measured}, below the formula's "
                f"{formula}, which the text says it is a little above"
            )
    return problems


def nb04_stalest(o: Outputs) -> list[str]:
    means = {
        int(w): float(s)
        for w, s in find_all(
            o, "e104b4db", r"worker (\d): \d+ updates, staleness mean ([\d.]+)"
        )
    }
    said = int(find(o, "e104b4db", r"stalest on average: worker (\d)")[1])
    if means[said] >= max(means.values()):
        return []
    return [f"cell e104b4db names worker {said} the stalest; the means are {means}"]


def nb04_step_against_estimate(o: Outputs) -> list[str]:
    problems = []
    for est, meas, ratio in find_all(
        o, "6cf413db", r"step \(ms\) +([\d.]+) +([\d.]+) +([\d.]+)"
    ):
        if abs(float(meas) / float(est) - float(ratio)) > 0.005 + 0.05 / float(
            est
        ) * float(ratio):
            problems.append(f"cell 6cf413db: {meas} / {est} ms is not {ratio}")
    return problems


# ------------------------------------------------------------------ notebook 05
def nb05_fastest_format(o: Outputs) -> list[str]:
    rates = {
        name.strip(): num(r)
        for name, r in find_all(
            o,
            "nb05-07",
            r"(?m)^(PNG files|one \.tar|one \.npy) +\d+ +\d+ +[\d.]+ +(\d+) +\d+$",
        )
    }
    m = find(o, "nb05-07", r"fastest here: ([^,\n]+)(?:, (.*))?")
    best = max(rates, key=rates.get)
    problems = []
    if m[1] != best:
        problems.append(f"cell nb05-07 names {m[1]} fastest; its rates are {rates}")
    for ratio, name in re.findall(r"([\d.]+)x ([^\n]+?)(?: and |$)", m[2] or ""):
        want = rates[best] / rates[name]
        if abs(want - float(ratio)) > 0.005 + want * (
            0.5 / rates[best] + 0.5 / rates[name]
        ):
            problems.append(
                f"cell nb05-07: {best} is {want:.2f}x {name}, it prints {ratio}x"
            )
    return problems


# The same 1,437 PNG files opened and decoded by the training process itself, in two
# cells: nb05-11 adds a random crop and times the second epoch. Within 2x.
SAME_FILES_SAME_PROCESS = 2.0


def nb05_png_rate_twice(o: Outputs) -> list[str]:
    png = num(find(o, "nb05-07", r"(?m)^PNG files +\d+ +\d+ +[\d.]+ +(\d+)")[1])
    none = num(find(o, "nb05-11", r"num_workers=0: .*? (\d+) files opened/s")[1])
    if within(png, none, SAME_FILES_SAME_PROCESS):
        return []
    return [
        f"the PNG files are read at {png:,.0f} samples/s in cell nb05-07 and "
        f"{none:,.0f} files/s without workers in cell nb05-11: more than "
        f"{SAME_FILES_SAME_PROCESS}x apart"
    ]


def nb05_workers_ratio(o: Outputs) -> list[str]:
    problems = _ratio_line(o, "nb05-11", "2 workers")
    pace = {
        int(w): num(r)
        for w, r in find_all(
            o, "nb05-11", r"num_workers=(\d): .*? (\d+) files opened/s"
        )
    }
    line = re.search(RATIO_LINE, o["nb05-11"])
    if line and (num(line["rate"]), num(line["base_rate"])) != (pace[2], pace[0]):
        problems.append(
            f"cell nb05-11's ratio reads {line['rate']} and {line['base_rate']}, "
            f"its rows print {pace}"
        )
    return problems


def nb05_starved_device(o: Outputs) -> list[str]:
    rows = {
        name: (float(ms), float(proc))
        for name, ms, proc in find_all(
            o,
            "d40d01ae",
            r"(?m)^(decode in the loop|decoded ahead)"
            r" +[\d.]+ +\d+ +([\d.]+) +\d+ +(\d+)$",
        )
    }
    loop, ahead = rows["decode in the loop"][0], rows["decoded ahead"][0]
    m = find(
        o,
        "d40d01ae",
        r"decode in the loop: ([\d.]+) ms a step against ([\d.]+) ms decoded ahead:\s+"
        r"(?:(-?[\d.]+) ms of each step(?: \((\d+)%\))? prepared data"
        r"|(no step waited))",
    )
    problems = []
    if (float(m[1]), float(m[2])) != (loop, ahead):
        problems.append(
            f"cell d40d01ae's verdict reads {m[1]} and {m[2]} ms, its table {loop} "
            f"and {ahead}"
        )
    if m[5] is not None and loop - ahead > 0.1:
        problems.append(
            f"cell d40d01ae says no step waited, with {loop} against {ahead} ms"
        )
    if m[3] is not None:
        if abs(float(m[3]) - (loop - ahead)) > 0.11:
            problems.append(f"cell d40d01ae: {loop} - {ahead} is not {m[3]} ms")
        if (
            m[4] is not None
            and loop > 0
            and abs(int(m[4]) - (loop - ahead) / loop * 100) > 1
        ):
            problems.append(f"cell d40d01ae: {m[3]} of {loop} ms is not {m[4]}%")
    c = find(
        o,
        "d40d01ae",
        r"kept ([\d.]+) and ([\d.]+) of (\d+) cores busy: about one core in both: "
        r"(yes|no)",
    )
    for (name, (_, proc)), cores in zip(rows.items(), (c[1], c[2]), strict=True):
        if abs(proc * int(c[3]) / 100 - float(cores)) > 0.5 * int(c[3]) / 100 + 0.005:
            problems.append(
                f"cell d40d01ae: {name} used {proc}% of {c[3]} cores, not {cores} cores"
            )
    one = all(0.75 <= float(x) <= 1.25 for x in (c[1], c[2]))
    if (c[4] == "yes") != one:
        problems.append(
            f"cell d40d01ae says about one core in both: {c[4]}, for {c[1]} and {c[2]}"
        )
    return problems


def nb05_interface_count(o: Outputs) -> list[str]:
    problems = []
    for ranks, sent, model, ratio, counted, ok in find_all(
        o,
        "696a3c25",
        r"(\d) ranks: ([\d.]+) MB sent per rank, ring model .* = ([\d.]+) MB "
        r"\(([\d.]+)x\)\n"
        r"\s+lo counted ([\d.]+) MB per rank, .*within 5% above: (True|False)",
    ):
        if abs(float(sent) / float(model) - float(ratio)) > 0.006:
            problems.append(
                f"cell 696a3c25, {ranks} ranks: {sent} / {model} MB is not {ratio}x"
            )
        above = float(counted) / float(sent)
        if str(0.999 <= above <= 1.05) != ok and abs(above - 1.05) > 0.001:
            problems.append(
                f"cell 696a3c25, {ranks} ranks: lo counted {counted} against {sent} "
                f"MB, it says {ok}"
            )
    return problems


@dataclass(frozen=True)
class Check:
    notebook: str  # the file name's first two characters
    kind: str  # "printed twice", "measured twice" or "concluded"
    run: Callable[[Outputs], list[str]]

    @property
    def name(self) -> str:
        return self.run.__name__


CHECKS = [
    Check("01", "printed twice", nb01_history_printed_twice),
    Check("01", "measured twice", nb01_fp32_against_baseline),
    Check("01", "concluded", nb01_bf16_conclusion),
    Check("01", "measured twice", nb01_compile_eager_against_baseline),
    Check("01", "measured twice", nb01_compile_step_against_epoch),
    Check("01", "concluded", nb01_break_even),
    Check("01", "concluded", nb01_fixed_shares),
    Check("01", "measured twice", nb01_fitted_step_against_baseline),
    Check("01", "concluded", nb01_profile_leader),
    Check("02", "printed twice", nb02_history_printed_twice),
    Check("02", "printed twice", nb02_plain_script_ranks_agree),
    Check("02", "concluded", nb02_bucket_trend),
    Check("02", "concluded", nb02_allreduce_summary),
    Check("02", "concluded", nb02_scaling_tables),
    Check("02", "measured twice", nb02_ring_prediction_twice),
    Check("03", "printed twice", nb03_same_runs_printed_again),
    Check("03", "measured twice", nb03_section3_again_in_section9),
    Check("03", "concluded", nb03_batch_verdicts),
    Check("03", "printed twice", nb03_scaling_job),
    Check("04", "measured twice", nb04_gpipe_measured_twice),
    Check("04", "concluded", nb04_stalest),
    Check("04", "concluded", nb04_step_against_estimate),
    Check("05", "concluded", nb05_fastest_format),
    Check("05", "measured twice", nb05_png_rate_twice),
    Check("05", "concluded", nb05_workers_ratio),
    Check("05", "concluded", nb05_starved_device),
    Check("05", "concluded", nb05_interface_count),
]


def problems_of(check: Check, outputs: Outputs) -> list[str]:
    """What ``check`` finds wrong in ``outputs``; a missing label is a problem too."""
    try:
        return check.run(outputs)
    except Missing as missing:
        return [str(missing)]
    except (KeyError, ValueError, ZeroDivisionError) as error:
        return [f"{check.name} could not read the figures: {error!r}"]


def main(paths: list[str]) -> int:
    """Run every check of each given notebook file; print what agrees and what not."""
    failed = 0
    for path in map(Path, paths):
        outputs = outputs_of(path)
        for check in (c for c in CHECKS if c.notebook == path.name[:2]):
            problems = problems_of(check, outputs)
            failed += bool(problems)
            print(
                f"{'FAIL' if problems else 'ok  '} {path.name[:2]} {check.kind:15} "
                f"{check.name}"
            )
            for p in problems:
                print(f"       {p}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
