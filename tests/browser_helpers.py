"""A real browser on the workshop, for tests/browser: JupyterLab serving a temporary
copy of the notebooks, and a headless Chromium that Selenium drives through Debian's
chromedriver (never a downloaded one).

Everything started here carries a mark in its environment (``MARK_VAR``), which every
child inherits: the server, its kernels and their ranks, chromedriver and Chromium's
processes. :func:`marked_processes` finds them in /proc, so a test can assert that
nothing it started is left, and stop whatever is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import ROOT, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
JUPYTER = Path(sys.executable).with_name("jupyter")
# What a classroom projector shows (workshop/draw/projector.py's PROJECTOR_PX).
SCREEN = (1280, 720)
ARTEFACTS = ROOT / "test-artifacts" / "browser"
MARK_VAR = "WORKSHOP_BROWSER_TEST"
_RANK_NAME = re.compile(r"^w[0-9a-z]+\.[0-9a-z]+$")
# What the notebooks read next to them (../slurm, ...): linked, not copied, and only
# read. notebooks/ itself is copied, as JupyterLab autosaves; so is docs/, whose
# pages a test opens in JupyterLab, which writes a checkpoint beside what it opens.
LINKED = ("slurm", "scripts")
COPIED = ("docs",)
# Chromium as root in a closed network: no sandbox (it refuses root otherwise), no
# GPU, and none of the requests a browser makes on its own.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--window-size={SCREEN[0]},{SCREEN[1]}",
)
# The user's settings would change what the page shows: tests start from defaults,
# with the news and update checks (requests to the internet) off.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if not missing:
        return None
    return (
        f"needs {', '.join(missing)}: make setup installs them "
        "(apt-get install chromium chromium-driver as root; selenium from "
        "requirements.txt)"
    )


# --- processes --------------------------------------------------------------------


def marked_processes(mark: str) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment holds
    ``MARK_VAR=mark`` (zombies are left out: they are gone, only not yet reaped)."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state not in (b"Z", b"X"):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(
                errors="replace"
            )
    return found


def rank_processes(mark: str) -> dict[int, str]:
    """The marked processes that are ranks of a ``workshop.launch``, or started by
    one: a rank names itself after its launch's tag (``w<kernel pid>.<launch>`` in
    base 36, /proc/PID/comm) and what it starts has ``WORKSHOP_LAUNCH`` in its
    environment (workshop/ranks/sweep.py)."""
    ranks = {}
    for pid, cmdline in marked_processes(mark).items():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if _RANK_NAME.match(name) or any(
            v.startswith(b"WORKSHOP_LAUNCH=") for v in environ
        ):
            ranks[pid] = f"{name}: {cmdline}"
    return ranks


def wait_gone(mark: str, within: float) -> dict[int, str]:
    """Wait up to ``within`` seconds for the marked processes to end; return the
    ones still alive."""
    deadline = time.monotonic() + within
    while True:
        left = marked_processes(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def stop_marked(mark: str, grace: float = 5.0) -> dict[int, str]:
    """TERM every marked process, wait ``grace`` seconds, KILL the rest; return
    those that had to be stopped this way."""
    left = marked_processes(mark)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not wait_gone(mark, grace):
            break
    wait_gone(mark, grace)
    return left


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


# --- JupyterLab ---------------------------------------------------------------------


def copy_workshop(root: Path) -> Path:
    """A workshop tree under ``root`` for JupyterLab to serve: notebooks/*.ipynb
    and docs/ copied (JupyterLab writes there), the folders they read linked.
    Returns ``root``."""
    (root / "notebooks").mkdir(parents=True)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy2(notebook, root / "notebooks" / notebook.name)
    for name in LINKED:
        if (ROOT / name).exists():
            (root / name).symlink_to(ROOT / name, target_is_directory=True)
    for name in COPIED:
        shutil.copytree(ROOT / name, root / name)
    return root


class Lab:
    """``jupyter lab`` on a free loopback port, serving ``tree``, with its settings,
    workspaces, runtime files and kernels' IPython profile under ``home``.

    Args:
        tree: the folder served (see :func:`copy_workshop`).
        home: an empty folder for everything Jupyter writes besides notebooks.
        mark: the value of ``MARK_VAR`` given to the server (and so its kernels).
    """

    def __init__(self, tree: Path, home: Path, mark: str):
        self.port = free_port()
        self.token = os.urandom(16).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        dirs = {
            name: home / name
            for name in ("config", "data", "runtime", "ipython", "settings", "work")
        }
        for folder in dirs.values():
            folder.mkdir(parents=True)
        env = {
            **os.environ,
            MARK_VAR: mark,
            "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_DATA_DIR": str(dirs["data"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "IPYTHONDIR": str(dirs["ipython"]),
            "JUPYTER_PLATFORM_DIRS": "1",
        }
        command = [
            str(JUPYTER),
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={tree}",
            f"--LabApp.user_settings_dir={dirs['settings']}",
            # The workshop's own defaults, as make lab gives them: no news prompt.
            f"--LabApp.app_settings_dir={ROOT / 'scripts' / 'lab-settings'}",
            f"--LabApp.workspaces_dir={dirs['work']}",
            # window.jupyterapp: the tests drive the page through its commands.
            "--expose-app-in-browser",
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")
        self.log_path = home / "lab.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready(timeout=120)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        url = f"{self.url}/api/status?token={self.token}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    json.load(response)
                return
            except OSError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"JupyterLab did not answer on {self.url}:\n{self.log()}"
                    ) from None
                time.sleep(0.3)

    def log(self) -> str:
        """What the server printed so far (its last 4,000 characters)."""
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM (the server then shuts its kernels down), wait ``grace``, KILL."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._log.close()


# --- the browser --------------------------------------------------------------------


def start_browser(profile: Path, mark: str, log: Path):
    """A headless Chromium showing ``SCREEN`` pixels of page, driven by chromedriver.

    Selenium is given both programs, so Selenium Manager never looks for (or
    downloads) a browser or a driver.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = Service(
        str(CHROMEDRIVER), log_output=str(log), env={**os.environ, MARK_VAR: mark}
    )
    driver = webdriver.Chrome(service=service, options=options)
    try:
        # --window-size sets the outer window; the page itself must be the screen.
        width, height = SCREEN
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.set_script_timeout(120)
    except BaseException:
        driver.quit()
        raise
    return driver


def glossary_heading(term: str) -> str:
    """The heading docs/glossary.md has under its explicit anchor ``term``."""
    text = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    found = re.search(rf'^<a id="{re.escape(term)}"></a>\n## (.+)$', text, re.M)
    assert found, f'docs/glossary.md has no <a id="{term}"></a> above a heading'
    return found.group(1).strip()


def wait_until(what: str, check, timeout: float, poll: float = 0.2):
    """Call ``check()`` until it returns something true; return that. AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not within {timeout:.0f} s (last: {value!r})"
            )
        time.sleep(poll)


# JavaScript run in the page. `panel()` is the notebook opened last.
_JS_PRELUDE = """
const app = window.jupyterapp;
const panel = () => window.workshopPanel;  // set by Page.open_notebook
const cellAt = i => panel().content.widgets[i];
const box = e => { const b = e.getBoundingClientRect();
                   return {x: b.x, y: b.y, width: b.width, height: b.height}; };
"""


class Page:
    """The JupyterLab page in the browser, driven through ``window.jupyterapp``.

    Args:
        driver: from :func:`start_browser`.
        lab: the server to open.
        shots: the folder screenshots go to.
    """

    def __init__(self, driver, lab: Lab, shots: Path):
        self.driver = driver
        self.shots = shots
        driver.get(f"{lab.url}/lab?token={lab.token}")
        self._wait_restored()

    @classmethod
    def shown(cls, driver, shots: Path) -> Page:
        """The JupyterLab page the browser shows now, reached some other way (a
        hub's login, say). Its server must expose the app to the page
        (``LabApp.expose_app_in_browser``)."""
        page = cls.__new__(cls)
        page.driver = driver
        page.shots = shots
        page._wait_restored()
        return page

    def _wait_restored(self) -> None:
        wait_until(
            "JupyterLab's page to start",
            lambda: self.js("return !!(app && app.shell && app.commands);"),
            timeout=120,
            poll=0.5,
        )
        self.js_await("app.restored")  # every plugin active, the layout restored
        self.js("app.shell.collapseLeft(); app.shell.collapseRight();")

    def js(self, body: str, *args):
        """Run ``body`` (a function body; ``arguments`` are ``args``) in the page."""
        return self.driver.execute_script(_JS_PRELUDE + body, *args)

    def js_await(self, expression: str, *args):
        """Evaluate ``expression`` (a promise) in the page and return its value; a
        rejected promise raises AssertionError with the reason."""
        got = self.driver.execute_async_script(
            _JS_PRELUDE
            + "const done = arguments[arguments.length - 1];"
            + f"Promise.resolve().then(() => {expression})"
            + ".then(v => done({ok: v === undefined ? null : v}),"
            + " e => done({error: String(e && e.stack || e)}));",
            *args,
        )
        if "error" in got:
            raise AssertionError(f"in the page: {got['error']}")
        return got["ok"]

    def painted(self) -> None:
        """Return once the page has painted what was changed before the call (the
        second animation frame after it): a screenshot then shows it."""
        self.js_await(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )

    def news_toasts(self, until: float) -> list[str]:
        """JupyterLab's "Would you like to receive official Jupyter news?" toast, or
        any toast, seen over the page up to the clock's ``until``; [] if none. The
        workshop's lab settings (scripts/lab-settings, which make lab and the portal
        pass) answer the question; they become the defaults of the plugin's schema,
        as the server sends it, and the answer is checked first."""
        answer = self.js_await(
            "app.serviceManager.settings"
            ".fetch('@jupyterlab/apputils-extension:notification')"
            ".then(s => s.schema.properties.fetchNews.default)"
        )
        assert answer == "false", f"fetchNews defaults to {answer!r}"
        while True:
            toasts = self.js(
                "return [...document.querySelectorAll('.Toastify__toast')]"
                ".map(t => t.innerText);"
            )
            if toasts or time.monotonic() > until:
                return toasts
            time.sleep(0.5)

    def open_glossary_link(
        self, shot: str, term: str | None = None, close: bool = True
    ) -> str:
        """Click the open notebook's first link to ../docs/glossary.md (the first to
        ``glossary.md#term`` if ``term`` is given), wait for the glossary to open in
        a tab (it opens only where the server's root holds docs/ beside notebooks/)
        and, where the link names a term, for that term's heading to be in view (see
        :meth:`glossary_term_shown`); screenshot it as ``shot``; unless not ``close``,
        close it and show the notebook again. Return the link's href as JupyterLab
        resolved it (the hash kept)."""
        want = f"glossary.md#{term}" if term else "glossary.md"
        # The cell first, scrolled to: the notebook draws only cells near the view.
        index = self.js(
            """return panel().content.widgets.findIndex(c =>
              c.model.type === 'markdown' &&
              c.model.sharedModel.getSource().includes(arguments[0]));""",
            want,
        )
        assert index >= 0, f"the notebook has no markdown cell linking to {want}"
        self.js_await("panel().content.scrollToItem(arguments[0], 'center')", index)
        # Matched by path and hash: JupyterLab rewrites the href to the file's
        # download URL, with a query before the hash.
        href, fragment = wait_until(
            f"cell {index}'s link to {want} drawn",
            lambda: self.js(
                """const a = [...cellAt(arguments[0]).node
                  .querySelectorAll('.jp-RenderedMarkdown a')]
                  .find(a => a.pathname.endsWith('/glossary.md') &&
                             (!arguments[1] || a.hash === '#' + arguments[1]));
                if (!a) return null;
                a.scrollIntoView(); a.click();
                return [a.getAttribute('href'), a.hash.slice(1)];""",
                index,
                term or "",
            ),
            timeout=30,
        )
        wait_until(
            f"{href} to open in a tab",
            lambda: (
                self.js(
                    "const w = app.shell.currentWidget;"
                    "return w && w.context ? w.context.path : null;"
                )
                == "docs/glossary.md"
            ),
            timeout=30,
        )
        if fragment:
            # Named by the notebook's text: the href holds the page's _xsrf token.
            self.wait_glossary_term_shown(
                fragment, f"the link to glossary.md#{fragment} of cell {index}"
            )
        self.screenshot(shot)
        if close:
            self.js(
                "app.shell.currentWidget.close(); app.shell.activateById(panel().id);"
            )
        return href

    def glossary_term_shown(self, term: str) -> dict | None:
        """In the glossary open in the current tab (JupyterLab's Markdown viewer):
        the first heading at or below the anchor ``term`` (its text, without the ¶
        JupyterLab adds), whether the viewer shows that heading whole, and whether it
        shows the glossary's title; None while the anchor is not drawn.

        The anchor is the ``<a id="term">`` line above the heading; JupyterLab's
        sanitizer keeps an id as ``data-jupyter-id`` unless named properties are
        allowed, and looks a fragment up there (RenderedHTMLCommon.setFragment)."""
        return self.js(
            """const w = app.shell.currentWidget;
            if (!w || !w.context || w.context.path !== 'docs/glossary.md') return null;
            const view = w.content.node, name = CSS.escape(arguments[0]);
            const anchor = view.querySelector(
              `[data-jupyter-id="${name}"], #${name}`);
            if (!anchor) return null;
            const top = anchor.getBoundingClientRect().top;
            const heads = [...view.querySelectorAll('h1, h2, h3, h4, h5, h6')];
            const head = heads.find(h => h.getBoundingClientRect().bottom > top);
            const v = view.getBoundingClientRect();
            const shown = e => { const b = e.getBoundingClientRect();
              return b.height > 0 && b.top >= Math.max(v.top, 0) &&
                b.bottom <= Math.min(v.bottom, window.innerHeight); };
            const text = h => [...h.childNodes]
              .filter(n => !(n.classList && n.classList.contains(
                'jp-InternalAnchorLink')))
              .map(n => n.textContent).join('').trim();
            return {heading: head ? text(head) : null, shown: !!head && shown(head),
                    title_shown: shown(heads[0])};""",
            term,
        )

    def wait_glossary_term_shown(self, term: str, how: str) -> dict:
        """Wait for the glossary's heading of ``term`` to be in view (it scrolls
        there once the page is drawn), reached by ``how``; return
        :meth:`glossary_term_shown`'s answer. AssertionError if it is not the heading
        docs/glossary.md has under that anchor."""
        heading = glossary_heading(term)
        last = {}

        def shown():
            last["seen"] = self.glossary_term_shown(term)
            return last["seen"] and last["seen"]["shown"]

        try:
            wait_until(
                f"{how}: the glossary's heading {heading!r} (#{term}) in view",
                shown,
                timeout=30,
            )
        except AssertionError as error:
            raise AssertionError(f"{error}; seen: {last.get('seen')}") from None
        seen = last["seen"]
        assert seen["heading"] == heading, f"{how}: #{term} lands on {seen}"
        return seen

    def screenshot(self, name: str) -> Path:
        """Save what the page shows as ``shots/name.png``; print and return the path."""
        path = self.shots / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"no screenshot {path}"
        print(f"screenshot: {path}")
        return path

    def open_notebook(self, path: str) -> int:
        """Open ``path`` (relative to the served folder) with its kernel, wait for
        every stored output to be drawn; return the number of cells."""
        self.js_await(
            "app.commands.execute('docmanager:open', {path: arguments[0]})"
            ".then(w => { window.workshopPanel = w; app.shell.activateById(w.id);"
            " return w.context.ready.then(() => w.sessionContext.ready); })",
            path,
        )
        self.js("app.shell.collapseLeft(); app.shell.collapseRight();")
        assert self.js("return panel().context.path;") == path
        wait_until(
            f"{path}: every stored image drawn",
            lambda: self.js(
                """const missing = [];
                panel().content.widgets.forEach((c, i) => {
                  if (c.model.type !== 'code') return;
                  const stored = c.model.outputs.toJSON()
                    .filter(o => o.data && o.data['image/png']).length;
                  if (c.outputArea.node.querySelectorAll('img').length < stored)
                    missing.push(i);
                });
                return missing.length === 0;"""
            ),
            timeout=60,
        )
        return self.js("return panel().content.widgets.length;")

    def wait_kernel_idle(self, timeout: float = 120) -> None:
        wait_until(
            "the kernel to be idle",
            lambda: self.js(
                "const s = panel().sessionContext;"
                "return !!(s.session && s.session.kernel) &&"
                " s.kernelDisplayStatus === 'idle';"
            ),
            timeout=timeout,
        )

    def find_cell(self, text: str) -> int:
        """The index of the only code cell whose source contains ``text``."""
        found = self.js(
            """const found = [];
            panel().content.widgets.forEach((c, i) => {
              if (c.model.type === 'code' &&
                  c.model.sharedModel.getSource().includes(arguments[0])) found.push(i);
            });
            return found;""",
            text,
        )
        assert len(found) == 1, f"code cells containing {text!r}: {found}"
        return found[0]

    def insert_cell(self, after: int, source: str) -> int:
        """A new code cell below cell ``after`` holding ``source``; its index."""
        self.select(after)
        self.js_await("app.commands.execute('notebook:insert-cell-below')")
        index = self.js("return panel().content.activeCellIndex;")
        assert index == after + 1, f"the new cell is at {index}, not {after + 1}"
        self.js(
            "cellAt(arguments[0]).model.sharedModel.setSource(arguments[1]);",
            index,
            source,
        )
        return index

    def select(self, index: int) -> None:
        """Make cell ``index`` the only selected cell, in view, in command mode."""
        self.js(
            """const nb = panel().content;
            app.shell.activateById(panel().id);
            nb.mode = 'command';
            nb.deselectAll();
            nb.activeCellIndex = arguments[0];
            nb.scrollToItem(arguments[0], 'start');""",
            index,
        )

    def run_cell(self, index: int) -> None:
        """Start cell ``index`` the way Shift-Enter's sibling does (Run > Run Selected
        Cell), without waiting for it."""
        self.select(index)
        before = self.execution_count(index)
        self.js("app.commands.execute('notebook:run-cell');")
        # The prompt turns to [*] at once; the count changes when the kernel starts it.
        wait_until(
            f"cell {index} to be queued",
            lambda: self.running(index) or self.execution_count(index) != before,
            timeout=30,
            poll=0.05,
        )

    def execution_count(self, index: int):
        return self.js("return cellAt(arguments[0]).model.executionCount;", index)

    def running(self, index: int) -> bool:
        """Whether cell ``index`` shows the [*] prompt (queued or running)."""
        return self.js(
            "const p = cellAt(arguments[0]).node.querySelector('.jp-InputPrompt');"
            "return !!p && p.textContent.includes('*');",
            index,
        )

    def wait_done(self, index: int, timeout: float = 300) -> None:
        wait_until(
            f"cell {index} to finish",
            lambda: not self.running(index) and self.execution_count(index) is not None,
            timeout=timeout,
        )

    def run_and_wait(self, index: int, timeout: float = 300) -> str:
        """Run cell ``index``, wait for it to end; return its output's text."""
        self.run_cell(index)
        self.wait_done(index, timeout)
        return self.output_text(index)

    def output_text(self, index: int) -> str:
        """The text cell ``index``'s output area shows."""
        return self.js("return cellAt(arguments[0]).outputArea.node.innerText;", index)

    def outputs(self, index: int) -> list[dict]:
        """Cell ``index``'s outputs as the page draws them: their type, MIME type
        and text."""
        return self.js(
            """return Array.from(cellAt(arguments[0]).outputArea.node
                .querySelectorAll('.jp-OutputArea-output')).map(o => ({
              mime: o.getAttribute('data-mime-type'), cls: o.className,
              text: o.innerText}));""",
            index,
        )

    def images(self, index: int) -> list[dict]:
        """The images in cell ``index``'s output: loaded?, natural and shown size."""
        return self.js(
            """return Array.from(cellAt(arguments[0]).outputArea.node
                .querySelectorAll('img')).map(img => ({
              complete: img.complete, natural: [img.naturalWidth, img.naturalHeight],
              shown: box(img), src: img.src}));""",
            index,
        )
