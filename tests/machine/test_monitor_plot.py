"""workshop.machine.monitor_plot: the right panels with and without GPU values, drawn
from plain data; step gaps measured within a phase; samples saved and read back.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest

from workshop.draw.projector import projector_fit
from workshop.machine.monitor_plot import (
    PANELS,
    Sample,
    load_samples,
    plot_monitor,
    save_samples,
    step_gaps,
)

NO_GPU = "no GPU here: GPU panels not drawn"


def _samples(gpus: int = 0) -> list[Sample]:
    return [
        Sample(
            time=0.5 * (i + 1),
            cpu_percent=10.0 * i,
            process_cpu_percent=5.0 * i,
            memory_gib=2.0 + i,
            disk_read_mb_s=1.0,
            network_mb_s=0.5,
            gpu_percent=tuple(20.0 * i + g for g in range(gpus)),
            gpu_memory_gib=tuple(1.0 + g for g in range(gpus)),
        )
        for i in range(4)
    ]


def _lines(ax) -> dict[str, list[float]]:
    return {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}


def _fits_a_projector(fig) -> None:
    fit = projector_fit(fig)  # whole in a 1280x720 JupyterLab, labels >= 12 px
    assert fit.fits, fit.problems
    # No legend over the data: each sits above the highest value drawn.
    fig.canvas.draw()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        top = max(max(line.get_ydata(), default=0) for line in ax.get_lines())
        _, top_px = ax.transData.transform((0, top))
        assert legend.get_window_extent().y0 > top_px, ax.get_title(loc="left")


def test_without_gpu_values_the_gpu_panels_are_left_out_and_said_so():
    fig = plot_monitor(_samples(), steps=[0.2, 0.4, 1.0], title="a run")
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == [PANELS[k] for k in ("steps", "cpu", "memory", "io")]
    assert fig._suptitle.get_text() == f"a run  -  {NO_GPU}"
    cpu = _lines(fig.axes[1])
    assert cpu["whole machine"] == [0.0, 10.0, 20.0, 30.0]
    assert cpu["this process + children"] == [0.0, 5.0, 10.0, 15.0]
    assert _lines(fig.axes[2])["in use"] == [2.0, 3.0, 4.0, 5.0]
    assert set(_lines(fig.axes[3])) == {"disk read", "network in+out"}
    _fits_a_projector(fig)


def test_with_gpu_values_each_gpu_gets_a_line():
    fig = plot_monitor(_samples(gpus=2), steps=[0.2, 0.4])
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == [
        PANELS[k] for k in ("steps", "gpu", "gpu_memory", "cpu", "memory", "io")
    ]
    util = _lines(fig.axes[1])
    assert util["GPU 0"] == [0.0, 20.0, 40.0, 60.0]
    assert util["GPU 1"] == [1.0, 21.0, 41.0, 61.0]
    assert _lines(fig.axes[2])["GPU 1"] == [2.0] * 4
    assert fig._suptitle is None  # no title asked for, nothing to say
    _fits_a_projector(fig)


def test_steps_are_ticks_and_gaps_and_phases_are_a_legend():
    phases = [("slow", 0.0, 1.0), ("fast", 1.0, 2.0)]
    steps = [0.4, 0.8, 1.1, 1.2, 1.3]
    fig = plot_monitor(_samples(), steps=steps, phases=phases)
    steps_ax = fig.axes[0]
    dots, ticks = steps_ax.get_lines()[:2]
    assert list(ticks.get_xdata()) == steps
    assert list(dots.get_xdata()) == steps
    assert list(dots.get_ydata()) == pytest.approx([400, 400, 100, 100, 100])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["slow", "fast"]


def test_a_tall_first_step_is_marked_at_the_top_with_its_value():
    phases = [("p", 0.0, 10.0)]
    fig = plot_monitor(_samples(), steps=[5.0, 5.1, 5.2, 5.3], phases=phases)
    ax = fig.axes[0]
    assert ax.get_ylim()[1] == pytest.approx(130)  # 1.3 x the usual 100 ms
    assert [t.get_text() for t in ax.texts] == ["5000"]


def test_step_gaps_start_again_in_each_phase():
    gaps = step_gaps([1.0, 1.5, 5.0, 5.25], [("a", 0.5, 2), ("b", 4.5, 6)])
    assert gaps == [(1.0, 0.5), (1.5, 0.5), (5.0, 0.5), (5.25, 0.25)]
    # Without phases the first step has nothing before it.
    assert step_gaps([1.0, 1.5]) == [(1.5, 0.5)]
    assert step_gaps([]) == []


def test_bad_data_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"no samples to draw.*record for longer"):
        plot_monitor([])
    with pytest.raises(ValueError, match=r"the steps are not in time order"):
        plot_monitor(_samples(), steps=[1.0, 0.5])
    with pytest.raises(ValueError, match=r"the sample times are not in time order"):
        plot_monitor(_samples()[::-1])
    with pytest.raises(ValueError, match=r"phase \('p', 2.0, 1.0\) is not"):
        plot_monitor(_samples(), phases=[("p", 2.0, 1.0)])


@pytest.mark.parametrize("gpus", [0, 2])
def test_samples_are_saved_and_read_back(tmp_path, gpus):
    samples = _samples(gpus)
    save_samples(samples, tmp_path / "m.csv")
    assert load_samples(tmp_path / "m.csv") == samples


def test_a_gap_in_gpu_values_survives_the_file(tmp_path):
    sample = _samples(1)[0].with_gpus([math.nan], [1.5])
    save_samples([sample], tmp_path / "m.csv")
    (back,) = load_samples(tmp_path / "m.csv")
    assert math.isnan(back.gpu_percent[0]) and back.gpu_memory_gib == (1.5,)


def test_a_file_that_is_not_a_monitor_csv_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"is not a monitor CSV: its header is"):
        load_samples(path)
