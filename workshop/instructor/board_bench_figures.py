"""The figures of the class board's benchmark (``board_bench.py``): what one run
measured (:class:`BoardLoad`), the arithmetic on it (percentiles, CPU shares from
/proc) and the table the command prints, at most 88 columns wide."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .._house import WIDTH

__all__ = [
    "GOAL_S",
    "BoardLoad",
    "board_table",
    "burner_duties",
    "control_plan",
    "cpu_share",
    "machine_ticks",
    "percentile",
    "process_ticks",
    "slower_because",
]

GOAL_S = 1.0  # issue 48: p95 of board update latency under 1 s
POST_TIMEOUT_S = 2.0  # a kernel's poster gives up on a post after this (the spec)
WARM_S = 5.0  # the first seconds of the load, shown apart
# BoardLoad's lists of samples, which the JSON report leaves out.
SAMPLES = {"update", "update_sent", "post", "table", "pages", "lag"}
# The control: a p95 of 50 requests moves by tens of % between two runs of the same
# load, so the hub counts as slower because of the board only where its p95 under
# the board's load is more than this much above its p95 under the plain load.
CONTROL_MARGIN = 0.5
LOWEST_NICE = 19  # the nice value of the simulated kernels: they run on compute nodes


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values``, linear between the two nearest ranks
    (numpy's default); None for no values.

    Args:
        values: the samples, in any order.
        q: 0 to 100.

    Returns:
        The percentile, or None where there is no sample.

    Raises:
        ValueError: ``q`` is outside 0 to 100.

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
        >>> percentile([], 95) is None
        True
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must be a number from 0 to 100, not {q!r}; e.g. q=95")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def cpu_share(ticks: int, hz: int, seconds: float) -> float | None:
    """CPU ``ticks`` (utime + stime) over ``seconds`` of wall time, as % of one core;
    None where no time passed (never a division by a measured 0).

    Example:
        >>> cpu_share(150, 100, 2.0), cpu_share(5, 100, 0.0)
        (75.0, None)
    """
    if seconds <= 0 or hz <= 0:
        return None
    return 100.0 * ticks / hz / seconds


def process_ticks(pid: int | str = "self") -> int | None:
    """utime + stime of ``pid`` in clock ticks (/proc/PID/stat), None once gone.

    Example:
        >>> process_ticks() >= 0
        True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15


def machine_ticks(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) clock ticks of all the machine's cores since boot; busy is
    all but idle and I/O wait. (0, 0) where there is no /proc.

    Example:
        >>> busy, total = machine_ticks()
        >>> 0 <= busy <= total
        True
    """
    try:
        with open(path) as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    total = sum(ticks[:8])  # user .. steal; guest time is counted within user
    return total - sum(ticks[3:5]), total


def burner_duties(share: float | None, cores: int) -> list[float]:
    """Duty cycles of busy-loop processes that together use ``share`` % of one core:
    as few processes as can (each at most a whole core), at equal duties.

    Args:
        share: % of one core (150 = one and a half cores); None or 0: nothing.
        cores: the machine's cores: more than all of them is not asked for.

    Returns:
        One duty cycle (0 to 1] per process.

    Example:
        >>> burner_duties(150, 2), burner_duties(40, 2), burner_duties(0, 2)
        ([0.75, 0.75], [0.4], [])
    """
    if share is None or not math.isfinite(share) or share <= 0 or cores < 1:
        return []
    share = min(share, 100.0 * cores)
    count = math.ceil(share / 100.0 - 1e-9)
    return [share / 100.0 / count] * count


def control_plan(
    cpu: dict[str, float | None], cores: int
) -> list[tuple[float, int]] | None:
    """The plain CPU load of the control phase, as the load phase used it: the
    board's and the proxy's CPU at normal priority (they run on the hub's host),
    the simulated kernels' and poller's (``client``) at nice :data:`LOWEST_NICE`.

    Args:
        cpu: % of one core of "board", "proxy" and "client" over the load.
        cores: the machine's cores.

    Returns:
        ``(duty cycle, nice)`` per busy-loop process; None where a share was not
        measured (a process ended early): the control cannot be sized.

    Example:
        >>> control_plan({"board": 18.0, "proxy": 19.0, "client": 23.0}, 2)
        [(0.37, 0), (0.23, 19)]
    """
    shares = [cpu.get(name) for name in ("board", "proxy", "client")]
    if any(share is None for share in shares):
        return None
    board, proxy, client = shares
    return [(duty, 0) for duty in burner_duties(board + proxy, cores)] + [
        (duty, LOWEST_NICE) for duty in burner_duties(client, cores)
    ]


def slower_because(
    board_p95: float | None, plain_p95: float | None, margin: float = CONTROL_MARGIN
) -> str | None:
    """Why a hub page is slower under the board's load: "the board" where its p95
    is more than ``1 + margin`` times its p95 under the same plain CPU load (the
    board's traffic costs more than its CPU), else "the machine" (any CPU load of
    that size slows it as much). None without both (or a plain p95 of 0).

    Example:
        >>> slower_because(0.013, 0.012), slower_because(0.060, 0.012)
        ('the machine', 'the board')
        >>> slower_because(0.013, 0.0) is None
        True
    """
    if board_p95 is None or not plain_p95:
        return None
    return "the board" if board_p95 > (1.0 + margin) * plain_p95 else "the machine"


@dataclass
class BoardLoad:
    """What one run measured. Times in seconds; ``cpu`` in % of one core.

    Attributes:
        update: board update latency of every post that the table showed.
        update_sent: when each of those posts was sent, in seconds from the
            start of the load (the class's first posts wait for the hub to
            check each learner's token once).
        post: each POST's round trip.
        table: the poller's api/table round trips.
        pages: "before"/"during"/"control" -> page -> its round trips, through
            the proxy (as a browser) and "direct" to the hub's own port.
        lag: how late the client's 50 ms sleeps woke.
        cpu: "hub", "board", "proxy", "client" -> % of one core over the load;
            "machine": % of all cores busy (every process, other work too);
            "hub_pages_s": CPU-seconds the hub spent on the page requests before
            the load (the same requests are made during it).
        refused: "status: first line" of each post not answered 200.
        unseen: posts the table never showed within ``GRACE_S`` after the load.
        pids: the hub's, the proxy's and the board's, all stopped by the end.
        hub_requests: what the hub answered during the load, from its log, by
            method and path ("GET /hub/api/user": the board checking a token).
        post_to: where the learners posted: "proxy" (the hub's public URL) or
            "board" (the board's own address).
        nice: the nice value the simulated kernels and the poller ran at (None
            where it could not be set).
        control: the control phase after the load: "plan" (duty cycle, nice) of
            each busy-loop process, "target" and "got" (% of one core they were
            to use and used), "machine" (% of all cores busy), "skipped" (why
            there was none, or None).
    """

    learners: int
    seconds: float
    poll_interval: float
    cores: int
    load_before: list[float]
    load_after: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)
    update_sent: list[float] = field(default_factory=list)
    post: list[float] = field(default_factory=list)
    table: list[float] = field(default_factory=list)
    pages: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    lag: list[float] = field(default_factory=list)
    cpu: dict[str, float | None] = field(default_factory=dict)
    posts: int = 0
    refused: list[str] = field(default_factory=list)
    unseen: int = 0
    wall_seconds: float = 0.0
    pids: dict[str, int] = field(default_factory=dict)
    hub_requests: dict[str, int] = field(default_factory=dict)
    nice: int | None = None
    post_to: str = "proxy"
    control: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One row per measured quantity: its name, samples, p50, p95 and max (s),
        and for a hub page under the load its p95 over the p95 before (or None)."""
        named = [
            ("board update (sent -> on table)", self.update, None),
            (f"  of posts sent in the first {WARM_S:g} s", self._update(False), None),
            (f"  of posts sent after {WARM_S:g} s", self._update(True), None),
            ("POST api/records round trip", self.post, None),
            ("GET api/table (poller)", self.table, None),
        ]
        ratios = self.page_ratios()
        for when in ("before", "during"):
            for page, times in self.pages.get(when, {}).items():
                ratio = ratios.get(page) if when == "during" else None
                named.append((f"hub {page}, {when}", times, ratio))
        named.append(("client loop lag (50 ms sleeps)", self.lag, None))
        return [
            {
                "what": what,
                "n": len(times),
                "p50_s": percentile(times, 50),
                "p95_s": percentile(times, 95),
                "max_s": max(times) if times else None,
                "p95_vs_before": ratio,
            }
            for what, times, ratio in named
        ]

    def _update(self, later: bool) -> list[float]:
        return [
            latency
            for latency, sent in zip(self.update, self.update_sent, strict=True)
            if (sent >= WARM_S) == later
        ]

    def met(self) -> bool:
        """The goal: p95 of board update latency under 1 s, every post answered
        and shown."""
        p95 = percentile(self.update, 95)
        return p95 is not None and p95 < GOAL_S and not self.refused and not self.unseen

    def page_ratios(self) -> dict[str, float | None]:
        """Per hub page, p95 during the load / p95 before it (None without both)."""
        ratios = {}
        for page, before in self.pages.get("before", {}).items():
            was = percentile(before, 95)
            now = percentile(self.pages.get("during", {}).get(page, []), 95)
            ratios[page] = now / was if was and now is not None else None
        return ratios

    def control_rows(self) -> list[dict[str, Any]]:
        """Per hub page: its p95 before the load, under the board's load and under
        the same plain CPU load (s), their ratio and :func:`slower_because`."""
        rows = []
        for page, times in self.pages.get("during", {}).items():
            during = percentile(times, 95)
            plain = percentile(self.pages.get("control", {}).get(page, []), 95)
            rows.append(
                {
                    "page": page,
                    "before_p95_s": percentile(
                        self.pages.get("before", {}).get(page, []), 95
                    ),
                    "board_p95_s": during,
                    "plain_p95_s": plain,
                    "board_vs_plain": during / plain
                    if plain and during is not None
                    else None,
                    "because": slower_because(during, plain),
                }
            )
        return rows

    def report(self) -> dict[str, Any]:
        """The figures as JSON-ready data (the --json file): the table's rows and
        every count, not the samples (thousands of them)."""
        run = {k: v for k, v in asdict(self).items() if k not in SAMPLES}
        return {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "python": sys.version.split()[0],
            "goal_p95_s": GOAL_S,
            "met": self.met(),
            "posts_over_post_timeout": sum(t > POST_TIMEOUT_S for t in self.post),
            "rows": self.rows(),
            "page_p95_ratio": self.page_ratios(),
            "control_margin": CONTROL_MARGIN,
            "control_rows": self.control_rows(),
            "run": run,
        }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _hub_lines(requests: dict[str, int]) -> list[str]:
    """What the hub answered during the load, in two lines."""
    pages = sum(requests.get(f"GET {path}", 0) for path in ("/hub/api/", "/hub/login"))
    checks = requests.get("GET /hub/api/user", 0)
    lists = requests.get("GET /hub/api/users", 0)
    other = sum(requests.values()) - pages - checks - lists
    return [
        f"the hub's log, during the load: {checks} token checks (GET /hub/api/user),",
        f"  {lists} lists of the class (GET /hub/api/users), {pages} timed pages, "
        f"{other} other",
    ]


def _because(rows: list[dict[str, Any]], where: str) -> str:
    """One verdict for the pages reached ``where`` ("direct", "via proxy")."""
    said = {row["because"] for row in rows if row["page"].endswith(where)}
    if not said or None in said:
        return "-"
    return "the board" if "the board" in said else "the machine"


def _control_lines(load: BoardLoad) -> list[str]:
    """The control phase: the hub's pages under the board's load and under the
    same plain CPU load, side by side, and what that says."""
    control = load.control
    lines = [
        "",
        "is the hub slower because of the board, or because the machine is busier?",
    ]
    if control.get("skipped"):
        return [*lines, f"  no control: {control['skipped']}"[:WIDTH]]
    plan = control.get("plan") or []
    duties = ", ".join(f"{duty:.2f} at nice {nice}" for duty, nice in plan)
    lines += [
        f"control, after the load, no board traffic: {len(plan)} busy-loop processes,",
        f"  duty cycle {duties or '-'}:"[:WIDTH],
        f"  {_pct(control.get('target'))} of one core asked (what the board, proxy "
        f"and kernels used), {_pct(control.get('got'))} used;",
        f"  all {load.cores} cores {_pct(control.get('machine'))} busy (under the "
        f"board's load: {_pct(load.cpu.get('machine'))})",
        f"{'hub page, p95 ms':<22}{'before':>8}{'board':>8}{'plain':>8}"
        f"{'b/plain':>9}  slower because of",
    ]
    rows = load.control_rows()
    for row in rows:
        ratio = row["board_vs_plain"]
        lines.append(
            f"{row['page']:<22}{_ms(row['before_p95_s']):>8}"
            f"{_ms(row['board_p95_s']):>8}{_ms(row['plain_p95_s']):>8}"
            f"{'-' if ratio is None else f'{ratio:.2f}x':>9}  "
            f"{row['because'] or '-'}"
        )
    lines += [
        f"verdict (the board where its p95 is over {1 + CONTROL_MARGIN:g}x the plain "
        "load's):",
        f"  at the hub's port: {_because(rows, 'direct')}; through the proxy: "
        f"{_because(rows, 'via proxy')}",
    ]
    return lines


def board_table(load: BoardLoad) -> str:
    """The figures as the command prints them, every line at most 88 columns.

    Example:
        >>> print(board_table(run_board_load(5, 3)))          # doctest: +SKIP
    """
    lines = [
        f"class board: {load.learners} learners posting every second for "
        f"{load.seconds:g} s",
        f"the instructor's poller reads api/table every {load.poll_interval:g} s; "
        f"{load.cores} cores",
        "the learners post "
        + (
            "to the board's own address, sparing the proxy"
            if load.post_to == "board"
            else "through the hub's proxy"
        ),
        "the simulated kernels and the poller (on a cluster: compute nodes): "
        + ("nice unchanged;" if load.nice is None else f"nice {load.nice};"),
        "  the hub, its proxy and the board at the nice they were started with",
        "load average (1, 5, 15 min): before "
        + " ".join(f"{v:.2f}" for v in load.load_before)
        + "; after "
        + " ".join(f"{v:.2f}" for v in load.load_after),
        "",
        f"{'what':<35}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}"
        f"{'p95 vs before':>15}",
    ]
    for row in load.rows():
        ratio = row["p95_vs_before"]
        lines.append(
            f"{row['what']:<35}{row['n']:>6}{_ms(row['p50_s']):>10}"
            f"{_ms(row['p95_s']):>10}{_ms(row['max_s']):>10}"
            f"{'' if ratio is None else f'{ratio:.2f}x':>15}".rstrip()
        )
    cpu = load.cpu
    hub_pages = "-" if cpu.get("hub_pages_s") is None else f"{cpu['hub_pages_s']:.2f}"
    lines += [
        "",
        f"CPU over the load, % of one core: hub {_pct(cpu.get('hub'))}, board "
        f"{_pct(cpu.get('board'))}, proxy {_pct(cpu.get('proxy'))}, this client "
        f"{_pct(cpu.get('client'))}",
        f"all {load.cores} cores of the machine (every process): "
        f"{_pct(cpu.get('machine'))} busy",
        f"the hub's pages alone, before the load: {hub_pages} CPU-s for "
        f"{sum(map(len, load.pages.get('before', {}).values()))} requests",
        *_hub_lines(load.hub_requests),
        f"posts: {load.posts} sent, {len(load.refused)} refused, "
        f"{sum(t > POST_TIMEOUT_S for t in load.post)} over a kernel's "
        f"{POST_TIMEOUT_S:g} s timeout, {load.unseen} never on the table",
    ]
    p95 = percentile(load.update, 95)
    lines.append(
        f"goal, board update p95 under {GOAL_S:g} s, every post shown: "
        f"{'-' if p95 is None else f'{p95:.3f} s'}: "
        f"{'met' if load.met() else 'NOT met'}"
    )
    for line in sorted(set(load.refused))[:5]:
        lines.append(f"  refused: {line}"[:WIDTH])
    if load.control:
        lines += _control_lines(load)
    return "\n".join(lines)
