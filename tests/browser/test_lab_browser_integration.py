"""The workshop in a real browser: JupyterLab at a projector's 1280x720, in headless
Chromium, as a learner sees it.

The notebooks open with their stored outputs drawn; cells of notebook 02 run from the
page (ranks' lines appear while the cell runs, a collective is drawn, the ring slider
moves the picture, the stop button interrupts a launch). JupyterLab serves a copy of
the notebooks (it autosaves), and every process it, its kernels and the browser
start is gone at the end. Screenshots and the measured sizes go to
test-artifacts/browser/ (sizes.json).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from browser_helpers import (
    ARTEFACTS,
    MARK_VAR,
    SCREEN,
    Lab,
    Page,
    browser_missing,
    copy_workshop,
    marked_processes,
    png_size,
    rank_processes,
    start_browser,
    stop_marked,
    wait_gone,
    wait_until,
)
from conftest import ROOT

from workshop.draw.projector import NOTEBOOK_AREA_PX

NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# How a widget looks when the browser shows its text/plain stand-in instead of it.
WIDGET_REPR = re.compile(r"\b[A-Z]\w*\((children|value|outputs|layout)=")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _digests() -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
    }


def test_what_the_tests_start_is_found_and_stopped(tmp_path):
    """The leftover check at the end sees a process by its mark, through an exec,
    and stops it."""
    mark = str(tmp_path)
    env = {**os.environ, MARK_VAR: mark}
    child = subprocess.Popen(["sh", "-c", "exec sleep 300"], env=env)
    try:
        wait_until("the marked child", lambda: child.pid in marked_processes(mark), 30)
        assert child.pid not in marked_processes(mark + "-other")
        assert child.pid in stop_marked(mark, grace=5)
        assert child.wait(10) != 0
        assert not marked_processes(mark)
    finally:
        child.kill()
        child.wait(10)


class Session:
    """The page, its server, and what was measured in it."""

    def __init__(self, page: Page, mark: str):
        self.page = page
        self.mark = mark
        self.views: dict[str, dict] = {}
        self.sizes = {"screen": list(SCREEN), "notebooks": {}}

    def view(self, notebook: str) -> dict:
        """Open ``notebook`` (once) and measure its stored outputs; see _look_at."""
        if notebook not in self.views:
            self.views[notebook] = _look_at(self.page, notebook)
            self.sizes["notebooks"][notebook] = self.views[notebook]["sizes"]
            (ARTEFACTS / "sizes.json").write_text(json.dumps(self.sizes, indent=1))
            print(f"sizes: {ARTEFACTS / 'sizes.json'}")
        return self.views[notebook]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the workshop and a browser showing it; everything
    started is stopped afterwards, and the real notebooks are left as they were."""
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    before = _digests()
    tmp = tmp_path_factory.mktemp("browser")
    mark = str(tmp)
    shutil.rmtree(ARTEFACTS, ignore_errors=True)
    ARTEFACTS.mkdir(parents=True)
    server = driver = None
    try:
        tree = copy_workshop(tmp / "workshop")
        server = Lab(tree, tmp / "home", mark)
        driver = start_browser(tmp / "chromium", mark, tmp / "chromedriver.log")
        yield Session(Page(driver, server, ARTEFACTS), mark)
    finally:
        if driver is not None:
            driver.quit()
        if server is not None:
            server.stop()
        # What the server, its kernels and chromedriver should have stopped
        # themselves; whatever is left is stopped now, then reported.
        left = wait_gone(mark, within=30)
        stop_marked(mark)
    assert not left, f"processes left after the browser and server stopped: {left}"
    _assert_not_written(before, mark)


def _assert_not_written(before: dict[str, str], mark: str) -> None:
    """The real notebooks are as they were before the server started.

    Where one changed anyway, it fails only if it holds this run's ``mark`` (every
    cell the tests add carries it): in a shared checkout a person may save a
    notebook meanwhile, and that is not the test's doing; it is only warned about.
    """
    changed = [
        name for name, digest in _digests().items() if before.get(name) != digest
    ]
    ours = [n for n in changed if mark in (ROOT / "notebooks" / n).read_text()]
    assert not ours, f"the test's cells were saved into the real notebooks: {ours}"
    if changed:
        warnings.warn(
            f"notebooks/{', '.join(changed)} changed during the browser tests, not "
            "by them (none holds a cell they added)",
            stacklevel=1,
        )


# --- the stored outputs -----------------------------------------------------------


def _look_at(page: Page, notebook: str) -> dict:
    """Open ``notebook`` and read what its stored outputs look like: per output its
    MIME types (stored) and how it is drawn, every image scrolled into view and
    photographed, and the sizes of the notebook area and output area."""
    page.open_notebook(f"notebooks/{notebook}")
    cells = page.js(
        """return panel().content.widgets.map((c, i) => {
          if (c.model.type !== 'code') return null;
          const children = Array.from(c.outputArea.node
            .querySelectorAll(':scope > .jp-OutputArea-child'));
          return c.outputArea.model.toJSON().map((o, j) => {
            const drawn = children[j] &&
              children[j].querySelector('.jp-OutputArea-output');
            return {stored: Object.keys(o.data || {}), type: o.output_type,
                    mime: drawn ? drawn.getAttribute('data-mime-type') : null,
                    text: drawn ? drawn.innerText : null};
          });
        });"""
    )
    # The notebook draws only the cells near the view (a windowed list): the output
    # area is measured on the first cell with outputs, scrolled into view first.
    first = next(i for i, outputs in enumerate(cells) if outputs)
    page.js_await("panel().content.scrollToItem(arguments[0], 'start')", first)
    wait_until(
        f"{notebook}: the outputs of cell {first} drawn",
        lambda: page.js(
            """const o = cellAt(arguments[0]).outputArea.node
              .querySelector('.jp-OutputArea-output');
            return !!o && o.isConnected && o.clientWidth > 0;""",
            first,
        ),
        timeout=30,
        poll=0.1,
    )
    area = page.js(
        """const outer = panel().node.querySelector('.jp-WindowedPanel-outer');
        const output = cellAt(arguments[0]).outputArea.node
          .querySelector('.jp-OutputArea-output');
        return {page: [window.innerWidth, window.innerHeight],
                notebook_area: [outer.clientWidth, outer.clientHeight],
                output_area_width: output ? output.clientWidth : null,
                left_open: !app.shell.leftCollapsed,
                right_open: !app.shell.rightCollapsed};""",
        first,
    )
    images = []
    stem = Path(notebook).stem
    for index, outputs in enumerate(cells):
        if not outputs or not any("image/png" in o["stored"] for o in outputs):
            continue
        for k in range(len(page.images(index))):
            page.js(
                """const img = cellAt(arguments[0]).outputArea.node
                  .querySelectorAll('img')[arguments[1]];
                const outer = panel().node.querySelector('.jp-WindowedPanel-outer');
                img.scrollIntoView({block: img.getBoundingClientRect().height
                                    <= outer.clientHeight ? 'center' : 'start'});""",
                index,
                k,
            )
            page.painted()  # the scrolled page, before the shot
            # Measured in view: the browser lays out cells far off screen lazily.
            image = page.images(index)[k]
            shot = page.screenshot(f"{stem}-{len(images) + 1}")
            images.append(
                {
                    "cell": index,
                    "complete": image["complete"],
                    "natural": image["natural"],
                    "shown": [image["shown"]["width"], image["shown"]["height"]],
                    "screenshot": str(shot.relative_to(ROOT)),
                    "screenshot_px": list(png_size(shot)),
                }
            )
    text = page.js(
        "return Array.from(panel().node.querySelectorAll('.jp-OutputArea'))"
        ".map(o => o.innerText).join('\\n');"
    )
    sizes = {**area, "images": images}
    return {"cells": cells, "sizes": sizes, "text": text}


def test_no_news_prompt_covers_the_page(lab):
    # JupyterLab asks "Would you like to receive official Jupyter news?" in a toast
    # over the bottom-right corner of every page unless its settings answer it; the
    # workshop's do. The question comes a moment after the page is ready: looked for
    # over 5 s, on the loaded lab (no notebook needs opening for it).
    assert lab.page.news_toasts(until=time.monotonic() + 5) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_stored_outputs_are_drawn(lab, notebook):
    view = lab.view(notebook)
    sizes = view["sizes"]
    assert sizes["page"] == list(SCREEN), f"the page is {sizes['page']}, not {SCREEN}"
    assert not sizes["left_open"] and not sizes["right_open"], sizes
    stored = sum(
        "image/png" in o["stored"]
        for outputs in view["cells"]
        if outputs
        for o in outputs
    )
    images = sizes["images"]
    assert len(images) == stored, f"{stored} stored images, {len(images)} drawn"
    broken = [i for i in images if not (i["complete"] and i["natural"][0] > 0)]
    assert not broken, f"{notebook}: images that did not load: {broken}"
    for image in images:
        assert image["screenshot_px"] == list(SCREEN), image
    assert "Error displaying widget" not in view["text"], notebook


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_stored_widgets_are_not_shown_as_their_repr(lab, notebook):
    """A widget's stored output must not show its text stand-in, e.g.
    ``VBox(children=(HBox(...``. In a fresh checkout the notebooks are not trusted
    (JupyterLab trusts only outputs this machine made), and JupyterLab then draws
    a widget's text/plain instead of the widget."""
    view = lab.view(notebook)
    shown = [
        (index, o["text"][:120])
        for index, outputs in enumerate(view["cells"])
        if outputs
        for o in outputs
        if o["text"] and WIDGET_REPR.search(o["text"])
    ]
    assert not shown, f"{notebook}: widgets shown as text (cell, text): {shown}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_stored_figures_fit_the_projector(lab, notebook):
    """Each stored image is seen whole at 1280x720: no wider than a cell's output
    area as measured in the page (wider ones are shrunk, and their labels with them),
    and no taller than the height a browser window leaves the notebook on a 1280x720
    screen (workshop.draw.projector's figure; the headless page, with no tab or
    address bar, has more)."""
    sizes = lab.view(notebook)["sizes"]
    width = sizes["output_area_width"]
    _, page_height = sizes["notebook_area"]
    height = min(page_height, NOTEBOOK_AREA_PX[1])
    assert abs(width - NOTEBOOK_AREA_PX[0]) <= 40, (
        f"the output area is {width} px wide in the page but projector.py assumes "
        f"{NOTEBOOK_AREA_PX[0]} px: update NOTEBOOK_AREA_PX"
    )
    too_big = [
        f"cell {i['cell']}: {i['natural'][0]}x{i['natural'][1]} px, shown "
        f"{i['shown'][0]:.0f}x{i['shown'][1]:.0f} ({i['screenshot']})"
        for i in sizes["images"]
        if i["shown"][1] > height or i["natural"][0] > width
    ]
    assert not too_big, (
        f"{notebook}: figures that do not fit {width}x{height} px: {too_big}"
    )


# --- running cells from the page ------------------------------------------------------


@pytest.fixture(scope="module")
def nb02(lab):
    """Notebook 02 open, its kernel idle, its imports cell run."""
    page = lab.page
    page.open_notebook("notebooks/02_distributed_data_parallel.ipynb")
    page.wait_kernel_idle()
    imports = page.find_cell("import torch.distributed as dist\n\nimport workshop")
    text = page.run_and_wait(imports, timeout=180)
    assert "Error" not in text, text
    return lab


def _new_cell(lab: Session, source: str) -> int:
    """A code cell holding ``source`` appended to the notebook; its index. Its first
    line names the run (``lab.mark``), so a copy saved in the wrong place is found."""
    last = lab.page.js("return panel().content.widgets.length - 1;")
    return lab.page.insert_cell(
        last, f"# added by tests/browser ({lab.mark})\n{source}"
    )


def test_launch_prints_every_rank(nb02):
    page = nb02.page
    index = page.find_cell("workshop.launch(hello, world_size=4)")
    text = page.run_and_wait(index)
    page.screenshot("02-run-hello")
    for rank in range(4):
        assert f"[rank {rank}] hello from rank {rank} of 4" in text, text
    assert "Error" not in text, text


def test_a_glossary_link_opens_the_glossary(nb02):
    # The notebooks link to ../docs/glossary.md, which opens only where the server's
    # root holds docs/ beside notebooks/ (make lab serves the project, the portal a
    # learner's copy of it): clicked, it opens in a tab of its own, at the term
    # the link names (02's first: #ddp).
    href = nb02.page.open_glossary_link("02-glossary-link")
    assert "#" in href, f"{href}: no term named, so no landing checked"


def test_a_glossary_link_lands_on_its_term(nb02):
    # JupyterLab opens ../docs/glossary.md#world-size in its Markdown viewer and
    # scrolls to the element with that id: the <a id="world-size"> line above
    # "## World size" (the heading's own name there is World-size; a git host's,
    # world-size). A term near the end: only a scroll brings it into view.
    page = nb02.page
    page.open_glossary_link("02-glossary-term", term="world-size", close=False)
    try:
        assert not page.glossary_term_shown("world-size")["title_shown"]
        # The glossary's index links within the page: its first entry, far above
        # the term shown now, scrolls back up to that term.
        clicked = page.js(
            """const a = app.shell.currentWidget.content.node
              .querySelector('a[href="#activation-checkpointing"]');
            if (!a) return false;
            a.click();
            return true;"""
        )
        assert clicked, "the glossary shows no index link to #activation-checkpointing"
        seen = page.wait_glossary_term_shown(
            "activation-checkpointing", "the glossary's index link"
        )
        assert not seen["title_shown"], seen
        page.screenshot("glossary-index-link")
    finally:
        page.js("app.shell.currentWidget.close(); app.shell.activateById(panel().id);")


def test_rank_output_appears_while_the_cell_runs(nb02, tmp_path):
    page = nb02.page
    gate = tmp_path / "second-line-may-come"
    index = _new_cell(
        nb02,
        f"""import pathlib
import time


def two_lines():
    rank = dist.get_rank()
    print(f"first line from rank {{rank}}", flush=True)
    for _ in range(600):  # the test lets it go on; at most 60 s
        if pathlib.Path({str(gate)!r}).exists():
            break
        time.sleep(0.1)
    print(f"second line from rank {{rank}}", flush=True)


workshop.launch(two_lines, world_size=2)""",
    )
    page.run_cell(index)
    wait_until(
        "both ranks' first line in the page",
        lambda: all(
            f"first line from rank {r}" in page.output_text(index) for r in (0, 1)
        ),
        timeout=120,
    )
    running = page.running(index)
    text = page.output_text(index)
    page.screenshot("02-live-first-line")
    gate.touch()
    assert running, "the cell no longer showed [*] when the first lines were there"
    assert "second line" not in text, text
    page.wait_done(index, timeout=120)
    text = page.output_text(index)
    page.screenshot("02-live-done")
    for rank in (0, 1):
        assert f"second line from rank {rank}" in text, text


def test_a_collective_is_drawn(nb02):
    page = nb02.page
    page.run_and_wait(page.find_cell("def show(fn, world_size=4):"))
    index = page.find_cell("show(broadcast)")
    count = page.execution_count(index)
    page.run_and_wait(index)
    assert page.execution_count(index) != count
    images = page.images(index)
    page.screenshot("02-broadcast")
    assert len(images) == 1, page.outputs(index)
    assert images[0]["complete"] and images[0]["natural"][0] > 0, images


def test_the_ring_slider_moves_the_picture(nb02):
    from selenium.webdriver.common.keys import Keys

    page = nb02.page
    index = page.find_cell("workshop.draw.ring_widget(steps)")
    page.run_and_wait(index)

    def picture():
        images = page.images(index)
        return images[0]["src"] if images and images[0]["complete"] else None

    first = wait_until("the ring picture", picture, timeout=60)
    handles = page.js(
        "return Array.from(cellAt(arguments[0]).outputArea.node"
        ".querySelectorAll('.widget-slider [role=slider]'));",
        index,
    )
    assert len(handles) == 1, page.outputs(index)
    handle = handles[0]
    step = float(handle.get_attribute("aria-valuenow"))
    assert step < float(handle.get_attribute("aria-valuemax")), "no step to move to"
    page.screenshot("02-ring-first-step")
    handle.send_keys(Keys.ARROW_RIGHT)
    wait_until(
        f"the slider to move from step {step:g} to the next",
        lambda: float(handle.get_attribute("aria-valuenow")) == step + 1,
        timeout=30,
    )
    changed = wait_until(
        "a new picture after the slider moved",
        lambda: (src := picture()) and src != first and src,
        timeout=60,
    )
    page.screenshot("02-ring-next-step")
    assert changed != first


def test_the_stop_button_interrupts_a_launch(nb02):
    page = nb02.page
    index = _new_cell(
        nb02,
        """import time


def sleepy():
    print(f"rank {dist.get_rank()} sleeps", flush=True)
    time.sleep(60)


workshop.launch(sleepy, world_size=2)""",
    )
    page.run_cell(index)
    wait_until(
        "both ranks running",
        lambda: all(f"rank {r} sleeps" in page.output_text(index) for r in (0, 1)),
        timeout=120,
    )
    assert len(rank_processes(nb02.mark)) >= 2, marked_processes(nb02.mark)
    page.screenshot("02-interrupt-running")
    buttons = page.js(
        "return Array.from(panel().toolbar.node.querySelectorAll("
        "'[data-command=\"notebook:interrupt-kernel\"]'));"
    )
    assert len(buttons) == 1, "no stop (interrupt) button in the notebook's toolbar"
    buttons[0].click()
    # Well before the ranks' 60 s sleep ends: the interrupt, not the end, stopped it.
    page.wait_done(index, timeout=30)
    page.screenshot("02-interrupt-done")
    outputs = page.js("return cellAt(arguments[0]).outputArea.model.toJSON();", index)
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "KeyboardInterrupt", outputs
    # The launcher's own line ends the output: printed, or as the error's one line.
    shown = page.output_text(index)
    last = [line for line in shown.splitlines() if line.strip()][-1]
    assert re.fullmatch(
        r"(KeyboardInterrupt: )?workshop\.launch: interrupted; stopped rank\(s\) 0, 1",
        last.strip(),
    ), shown
    assert not wait_gone_ranks(nb02.mark), "rank processes left after the interrupt"
    after = _new_cell(nb02, "1 + 1")
    page.run_and_wait(after, timeout=60)
    result = page.js("return cellAt(arguments[0]).outputArea.model.toJSON();", after)
    assert [o.get("data", {}).get("text/plain") for o in result] == ["2"], result
    page.screenshot("02-after-interrupt")
    # What the learner reads: a short error, none of the launcher's insides.
    assert "launcher.py" not in shown, shown
    traceback = [
        line
        for line in ANSI.sub("", "\n".join(errors[0]["traceback"])).splitlines()
        if line.strip()
    ]
    assert len(traceback) <= 4, "the traceback is long:\n" + "\n".join(traceback)


def wait_gone_ranks(mark: str, within: float = 15.0) -> dict[int, str]:
    """The ranks still alive after ``within`` seconds."""
    deadline = time.monotonic() + within
    while (left := rank_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_the_planner_replans_and_runs_a_fake_rank(nb02):
    """Notebook 04 §8's planner in a real JupyterLab: the first plan is drawn, a
    changed control replans, and the button runs a rank on the fake backend."""
    from selenium.webdriver.common.keys import Keys

    page = nb02.page
    index = _new_cell(
        nb02, 'workshop.planner.explore("transformer-8b", nodes=8, tp=8, zero=3)'
    )
    page.run_and_wait(index, timeout=180)

    def picture():
        images = page.images(index)
        return images[0]["src"] if images and images[0]["complete"] else None

    first = wait_until("the planner's first picture", picture, timeout=60)
    assert "dp = 8" in page.output_text(index)
    # Halve the nodes: the plan is redone for 32 GPUs (dp = 4) and redrawn.
    nodes = page.js(
        "return Array.from(cellAt(arguments[0]).outputArea.node"
        ".querySelectorAll('.widget-inline-hbox')).filter(b => b.innerText.trim()"
        ".startsWith('nodes')).map(b => b.querySelector('input'));",
        index,
    )
    assert len(nodes) == 1, page.output_text(index)
    nodes[0].send_keys(Keys.CONTROL, "a")
    nodes[0].send_keys("4", Keys.ENTER)
    wait_until("dp = 4 after the nodes changed",
               lambda: "dp = 4" in page.output_text(index), timeout=60)  # fmt: skip
    wait_until("a new picture", lambda: (src := picture()) and src != first, timeout=60)
    buttons = page.js(
        "return Array.from(cellAt(arguments[0]).outputArea.node"
        ".querySelectorAll('button'))"
        ".filter(b => b.innerText.includes('fake backend'));",
        index,
    )
    assert len(buttons) == 1, page.output_text(index)
    buttons[0].click()
    wait_until(
        "the fake-backend comparison under the plan",
        lambda: (
            "estimate" in page.output_text(index)
            and "framework" in page.output_text(index)
        ),
        timeout=180,
    )
    page.screenshot("04-planner-fake-rank")
