"""A learner on the private portal, in a real browser: JupyterHub's login page,
JupyterLab served from the learner's Slurm job, notebooks 02 and 03 run from the
page, and the server stopped from the hub's home page.

The portal (workshop/instructor/portal.py: a private two-node Slurm cluster, JupyterHub
with batchspawner, its proxy) starts once for the module with one learner, and is
stopped at the end, which must find nothing to force: no job left, no process
killed. Screenshots go to test-artifacts/browser/portal-*.png (1280x720).

Notebook 03 runs through its torchrun cell on one node and its sbatch/srun cells
(a two-node job whose ranks srun starts); its ``workshop.cluster.submit`` of
train_ddp.sbatch is left out, as it trains three epochs (a minute and more here).

Two things the test supplies where the portal does not (yet), each printed as
``WORKED AROUND`` when it is needed: where the learners run a venv that the portal
made (workshop/instructor/portal_learners.py), that venv has no ``etc/jupyter`` nor
``share/jupyter``, so their server starts without JupyterLab; and the learner's copy
of the workshop has no ``.venv/bin/activate``, which slurm/*.sbatch source.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from browser_helpers import (
    ARTEFACTS,
    SCREEN,
    Page,
    browser_missing,
    png_size,
    start_browser,
    stop_marked,
    wait_gone,
    wait_until,
)
from conftest import needs_private_slurm, open_to_all, proxy_missing

# The portal's packages (pip install -e ".[portal]": jupyterhub, batchspawner), which
# a GPU node's wheelhouse rightly leaves out: there these tests skip, saying so.
pytest.importorskip(
    "batchspawner",
    reason='the portal extra is not installed (pip install -e ".[portal]")',
)

from workshop.instructor import portal
from workshop.instructor.portal_hub import COPY
from workshop.instructor.portal_learners import processes_of

pytestmark = needs_private_slurm

# Paths from the server's root, the learner's copy of the workshop (portal_hub.py).
NB02 = "notebooks/02_distributed_data_parallel.ipynb"
NB03 = "notebooks/03_many_nodes.ipynb"
NODES = ("127.0.0.2", "127.0.0.3")
# portal.start's own words where the machine cannot run a portal (not root, no
# Slurm): a reason to skip. Any other PortalError is a failure.
CANNOT_START = "the private portal cannot start here"


@dataclass
class Learner:
    """The portal, the browser, and the learner logged in to it."""

    portal: portal.Portal
    driver: object
    name: str
    page: Page | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    shown: float = 0.0  # time.monotonic() when JupyterLab's page was first shown


def _skip_reason() -> str | None:
    return browser_missing() or proxy_missing()


def _learner_jupyter(folder: Path, home: Path) -> list[str]:
    """The learner's Jupyter configuration (~/.jupyter, owned by them): JupyterLab
    exposes its app to the page (the tests drive it through ``window.jupyterapp``,
    as in test_lab_browser_integration.py). Its settings are the portal's own
    (scripts/lab-settings: no news prompt, no update check), which the tests check.

    Where the portal gave the learners a venv of their own without the Jupyter
    files of this environment (``etc/jupyter``, ``share/jupyter``), their server
    would run without JupyterLab (404 at /user/NAME/lab): the learner's
    configuration then points at this environment's (see the module's docstring).
    Returns what was worked around, for the report."""
    config = home / ".jupyter"
    lab: dict = {"expose_app_in_browser": True}
    files: dict[Path, dict] = {}
    links: dict[Path, Path] = {}
    worked_around = []
    prefix = Path(json.loads((folder / "portal.json").read_text())["python"]).parents[1]
    ours = Path(sys.prefix)
    if prefix != ours and not (prefix / "etc" / "jupyter").exists():
        worked_around.append(
            f"the learners' venv {prefix} has no etc/jupyter nor share/jupyter: "
            f"the server extensions, JupyterLab's app and labextensions of {ours} "
            "given through the learner's ~/.jupyter and ~/.local/share/jupyter"
        )
        enabled = ours / "etc" / "jupyter" / "jupyter_server_config.d"
        for path in sorted(enabled.glob("*.json")):
            files[config / "jupyter_server_config.d" / path.name] = json.loads(
                path.read_text()
            )
        lab["app_dir"] = str(ours / "share" / "jupyter" / "lab")
        data = home / ".local" / "share" / "jupyter"
        links[data / "labextensions"] = ours / "share" / "jupyter" / "labextensions"
    files[config / "jupyter_server_config.json"] = {"LabApp": lab}
    files[config / "jupyter_lab_config.json"] = {"LabApp": lab}
    for path, values in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    for path, target in links.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target, target_is_directory=True)
    owner = home.stat()
    for top in (config, home / ".local"):
        for folder_, dirs, names in os.walk(top):
            for entry in (folder_, *(os.path.join(folder_, n) for n in dirs + names)):
                os.chown(entry, owner.st_uid, owner.st_gid, follow_symlinks=False)
    return worked_around


def _activate_in_copy(folder: Path, home: Path) -> list[str]:
    """The Slurm scripts the notebooks submit start with ``source
    .venv/bin/activate`` (slurm/*.sbatch's EDIT line), from the folder they are
    submitted in: the learner's copy ~/scaling-pytorch-hpc. Where the portal gave
    that copy no ``.venv``, one is written that activates the learners' Python
    (what the job inherits on PATH anyway). Returns what was worked around."""
    copy = home / COPY
    activate = copy / ".venv" / "bin" / "activate"
    if activate.exists():
        return []
    settings = json.loads((folder / "portal.json").read_text())
    prefix = Path(settings["python"]).parents[1]
    lines = [
        "# Written by tests/browser/test_portal_browser.py: the portal's copy had no",
        "# .venv, which slurm/*.sbatch source.",
        f"export VIRTUAL_ENV={prefix}",
        'export PATH="$VIRTUAL_ENV/bin:$PATH"',
        *(f"export {k}={v}" for k, v in settings["python_env"].items()),
    ]
    activate.parent.mkdir(parents=True)
    activate.write_text("\n".join(lines) + "\n")
    owner = home.stat()
    for path in (copy / ".venv", activate.parent, activate):
        os.chown(path, owner.st_uid, owner.st_gid)
    return [
        f"{copy} has no .venv/bin/activate, which slurm/hello_ranks.sbatch and "
        f"slurm/train_ddp.sbatch source: one written for {prefix}"
    ]


def _jobs(conf: Path, user: str) -> list[dict[str, str]]:
    """``user``'s jobs as squeue lists them on the portal's cluster."""
    done = subprocess.run(
        ["squeue", "-h", "-u", user, "-o", "%A|%T|%N|%j"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    jobs = []
    for line in done.stdout.splitlines():
        job_id, state, node, name = line.strip().split("|")
        jobs.append({"id": job_id, "state": state, "node": node, "name": name})
    return jobs


def _kernel_jobs(user: str) -> set[str]:
    """SLURM_JOB_ID of each of ``user``'s kernels (ipykernel), from /proc."""
    found = set()
    for pid, _, command in processes_of([user]):
        if "ipykernel" not in command:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"SLURM_JOB_ID="):
                found.add(entry.split(b"=", 1)[1].decode())
    return found


@pytest.fixture(scope="module")
def learner(request):
    """A portal with one learner on the run's private cluster (conftest's
    private_slurm; portal.start's slurm_conf), a browser, and the learner logged in
    through the hub's login page; everything is stopped at the end, and the
    portal's stop must have found nothing to force."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    cluster = request.getfixturevalue("private_slurm")
    with open_to_all(cluster) as conf:
        yield from _learner(conf)


def _learner(conf: Path):
    """learner's body, on the cluster of ``conf``."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTEFACTS.glob("portal-*.png"):
        old.unlink()
    folder = Path(tempfile.mkdtemp(prefix="wp-", dir="/tmp"))
    mark = str(folder)
    driver = started = stopped = None
    try:
        begun = time.monotonic()
        try:
            started = portal.start(
                folder, learners=1, prefix="browser", slurm_conf=conf
            )
        except portal.PortalError as error:
            if str(error).startswith(CANNOT_START):
                pytest.skip(str(error))
            raise
        print(f"portal started in {time.monotonic() - begun:.1f} s")
        name = started.learners[0]
        for note in _learner_jupyter(folder, Path(pwd.getpwnam(name).pw_dir)):
            print(f"WORKED AROUND: {note}")
        driver = start_browser(folder / "chromium", mark, folder / "chromedriver.log")
        yield Learner(started, driver, name)
    finally:
        if driver is not None:
            driver.quit()
        if started is not None:
            begun = time.monotonic()
            stopped = portal.stop(folder)
            print(f"portal stopped in {time.monotonic() - begun:.1f} s: {stopped}")
        left = wait_gone(mark, within=30)
        stop_marked(mark)
        shutil.rmtree(folder, ignore_errors=True)
    assert not left, f"browser processes left after it quit: {left}"
    assert stopped.jobs_left == [], f"jobs the hub did not cancel: {stopped}"
    assert stopped.killed == [], f"learner processes stop had to kill: {stopped}"
    # The instructor only where start made it (another portal may share it).
    assert set(started.learners) <= set(stopped.users_removed), stopped


@pytest.fixture(scope="module")
def lab(learner):
    """The learner logged in, in JupyterLab, notebook 02 open with its kernel idle."""
    p, driver, name = learner.portal, learner.driver, learner.name
    driver.get(p.url)
    wait_until(
        "the hub's login page",
        lambda: "/hub/login" in driver.current_url and _login_form(driver),
        timeout=60,
    )
    fields, submit = _login_form(driver)
    fields["username"].send_keys(name)
    fields["password"].send_keys(p.passwords[name])
    shot = ARTEFACTS / "portal-login.png"
    driver.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    clicked = time.monotonic()
    submit.click()
    wait_until(
        f"JupyterLab at /user/{name}/lab",
        lambda: f"/user/{name}/lab" in driver.current_url,
        timeout=120,
        poll=0.5,
    )
    page = Page.shown(driver, ARTEFACTS)
    learner.shown = time.monotonic()
    learner.seconds["login to JupyterLab"] = time.monotonic() - clicked
    page.screenshot("portal-lab")
    page.open_notebook(NB02)
    page.wait_kernel_idle()
    learner.seconds["login to a running kernel"] = time.monotonic() - clicked
    learner.page = page
    return learner


def _login_form(driver):
    """The login form's fields and submit button, or None before they are there."""
    from selenium.webdriver.common.by import By

    fields = {
        n: driver.find_elements(By.CSS_SELECTOR, f"form input[name={n}]")
        for n in ("username", "password")
    }
    submit = driver.find_elements(By.CSS_SELECTOR, "form #login_submit")
    if not all(fields.values()) or not submit:
        return None
    return {n: found[0] for n, found in fields.items()}, submit[0]


def _errors(page: Page, index: int) -> list[str]:
    """What cell ``index`` shows of an error: error outputs, and stderr holding a
    Python traceback."""
    found = page.js(
        """const errors = [];
        cellAt(arguments[0]).outputArea.model.toJSON().forEach(o => {
          if (o.output_type === 'error') errors.push(o.ename + ': ' + o.evalue);
        });
        cellAt(arguments[0]).outputArea.node.querySelectorAll(
          '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
        ).forEach(o => {
          if (o.innerText.includes('Traceback')) errors.push(o.innerText);
        });
        return errors;""",
        index,
    )
    return found


def _run(learner: Learner, source: str, timeout: float = 180) -> tuple[int, str]:
    """Run the code cell whose source holds ``source``, from the page; assert it
    shows no error; (its index, the text it shows)."""
    page = learner.page
    index = page.find_cell(source)
    started = time.monotonic()
    text = page.run_and_wait(index, timeout=timeout)
    seconds = time.monotonic() - started
    print(f"cell {index} ({source.splitlines()[0][:50]!r}): {seconds:.1f} s")
    errors = _errors(page, index)
    assert not errors, f"cell {index} ({source!r}) shows an error:\n" + "\n".join(
        errors
    )
    return index, text


def _shot(learner: Learner, name: str, index: int | None = None) -> Path:
    """A screenshot of the page, cell ``index``'s output in view."""
    page = learner.page
    if index is not None:
        page.js(
            "const o = cellAt(arguments[0]).outputArea.node;"
            "o.scrollIntoView({block: 'center'});",
            index,
        )
        page.painted()  # the scrolled page, before the shot
    path = page.screenshot(name)
    assert png_size(path) == SCREEN, path
    return path


def test_login_lands_in_jupyterlab_in_a_slurm_job(lab):
    """The login ends in JupyterLab, served from a running Slurm job of the learner
    on a node of the portal's cluster, and the notebook's kernel is in that job."""
    name = lab.name
    assert lab.driver.current_url.startswith(f"{lab.portal.url}user/{name}/lab")
    running = [j for j in _jobs(lab.portal.slurm_conf, name) if j["state"] == "RUNNING"]
    assert len(running) == 1, f"{name}'s jobs: {_jobs(lab.portal.slurm_conf, name)}"
    job = running[0]
    assert job["node"] in NODES, job
    assert job["name"] == f"jupyter-{name}", job
    # The notebook's kernel is a process of that job.
    kernels = _kernel_jobs(name)
    assert kernels == {job["id"]}, f"kernels in jobs {kernels}, the server's: {job}"
    assert lab.page.js("return panel().context.path;") == NB02
    print(f"{name}'s server: job {job['id']} on {job['node']}")
    # No news toast over the corner, looked for until 5 s after JupyterLab was shown
    # (long past, once a notebook's kernel is up); and a glossary link of notebook 02
    # opens the glossary of the learner's copy.
    assert lab.page.news_toasts(until=lab.shown + 5) == []
    lab.page.open_glossary_link("portal-glossary-link")
    for what, seconds in lab.seconds.items():
        print(f"{what}: {seconds:.1f} s")


def test_notebook_02_runs_its_first_launches_and_collectives(lab):
    """Notebook 02 from the top through its first launches and a collective's
    picture, every line of every rank on the page, no error."""
    page = lab.page
    _run(lab, "import torch.distributed as dist\n\nimport workshop")
    index, text = _run(lab, "workshop.launch(hello, world_size=4)")
    _shot(lab, "portal-02-hello", index)
    for rank in range(4):
        assert f"[rank {rank}] hello from rank {rank} of 4" in text, text
    index, text = _run(lab, "result = workshop.launch(sum_of_ranks, world_size=4)")
    for rank in range(4):
        assert f"[rank {rank}] after  all_reduce: 6.0" in text, text
    index, text = _run(lab, 'print(f"every rank holds {expected}:"')
    assert "every rank holds 6: True" in text, text
    _shot(lab, "portal-02-all-reduce", index)
    index, text = _run(lab, "workshop.launch(unlucky, world_size=4)")
    assert "ranks that failed: [2]" in text, text
    assert "rank 2 ran out of memory (pretend)" in text, text
    _shot(lab, "portal-02-failing-rank", index)
    _run(lab, "def show(fn, world_size=4):")
    index, _ = _run(lab, "show(broadcast)")
    images = page.images(index)
    assert len(images) == 1, page.outputs(index)
    assert images[0]["complete"] and images[0]["natural"][0] > 0, images
    _shot(lab, "portal-02-broadcast", index)
    page.js_await("app.commands.execute('docmanager:save')")


def test_notebook_03_runs_torchrun_and_slurm_jobs(lab):
    """Notebook 03's torchrun cell and its Slurm cells, from a kernel that itself
    runs in a Slurm job: sinfo, sbatch, a two-node job whose ranks srun starts."""
    page = lab.page
    home = Path(pwd.getpwnam(lab.name).pw_dir)
    for note in _activate_in_copy(lab.portal.folder, home):
        print(f"WORKED AROUND: {note}")
    page.open_notebook(NB03)
    page.wait_kernel_idle()
    _run(lab, 'os.chdir("..")')
    index, text = _run(lab, '"--checkpoint", "runs/one_node.pt"', timeout=240)
    _shot(lab, "portal-03-torchrun", index)
    assert "2 ranks on 1 node(s), started by torchrun" in text, text
    assert "done: weight checksum" in text, text
    index, text = _run(lab, "cluster = workshop.cluster.slurm_cluster()")
    # The portal's own cluster, which the kernel's job runs on.
    assert str(lab.portal.slurm_conf) in text and "2 nodes" in text, text
    index, text = _run(lab, "!sinfo")
    assert all(node in text for node in NODES), text
    index, text = _run(lab, "slurm/hello_ranks.sbatch")
    assert "JobState=" in text, text  # sbatch gave a job id that scontrol knows
    _shot(lab, "portal-03-sbatch", index)
    index, text = _run(lab, "!scancel {sleeper}", timeout=240)
    _shot(lab, "portal-03-srun", index)
    assert "started by srun" in text, text
    for rank in range(2):
        assert f"hello from rank {rank} of 2" in text, text
    page.js_await("app.commands.execute('docmanager:save')")


def test_stop_my_server_ends_the_job_and_every_process(lab):
    """ "Stop My Server" on the hub's home page cancels the job, and nothing of the
    learner is left running."""
    from selenium.webdriver.common.by import By

    driver, name, conf = lab.driver, lab.name, lab.portal.slurm_conf
    assert _jobs(conf, name), f"{name} has no job to stop"
    driver.get(lab.portal.url + "hub/home")
    stop = wait_until(
        "the hub's Stop My Server button",
        lambda: [b for b in driver.find_elements(By.ID, "stop") if b.is_displayed()],
        timeout=60,
    )[0]
    assert stop.text.strip() == "Stop My Server", stop.text
    stop.click()
    started = time.monotonic()

    loaded = [started]

    def stopped():
        shown = [b for b in driver.find_elements(By.ID, "stop") if b.is_displayed()]
        start = driver.find_elements(By.ID, "start")
        if not shown and start and start[0].text.strip() == "Start My Server":
            return True
        # The page changes its buttons when the hub answers the stop; on a loaded
        # machine (a CI run) that answer can come after the page gave up waiting
        # for it. A learner would reload the page, which the hub draws from the
        # server's state: so does this, every 20 s.
        if time.monotonic() - loaded[0] > 20:
            driver.get(lab.portal.url + "hub/home")
            loaded[0] = time.monotonic()
        return False

    wait_until("the hub to say the server stopped", stopped, timeout=180)
    print(f"server stopped in {time.monotonic() - started:.1f} s")
    shot = ARTEFACTS / "portal-hub-stopped.png"
    driver.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert png_size(shot) == SCREEN
    deadline = time.monotonic() + 20
    while (jobs := _jobs(conf, name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert jobs == [], f"{name}'s job is still in squeue after the hub stopped it"
    while (left := processes_of([name])) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"{name}'s processes left 20 s after the server stopped"
