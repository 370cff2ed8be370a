"""The class board's page: plain HTML, a little CSS and vanilla JavaScript, nothing
fetched from elsewhere (a portal's browser may have no internet).

The script asks ``api/table`` every 2 s and redraws: the summary lines at the top, then
one row per learner (notebook and section, each exercise as a chip, quiz scores, last
error, a raised hand with its Clear button, the job and when last seen). Learners'
text is put in with ``textContent``, never as HTML, so a section title cannot run
script on the instructor's page. It fits a 1280x720 projector for about ten
learners, in type no smaller than 12 px.
"""

from __future__ import annotations

import html

__all__ = ["page_html", "refused_html"]

STYLE = """
body { font: 14px/1.3 system-ui, sans-serif; margin: 8px 14px; color: #1b1b1b; }
h1 { font-size: 19px; margin: 0; }
header { display: flex; gap: 16px; align-items: baseline; flex-wrap: wrap; }
#status { color: #555; font-size: 13px; }
#status.bad { color: #b00020; font-weight: 600; }
#summary { margin: 4px 0 6px; display: flex; flex-wrap: wrap; gap: 2px 18px; }
#summary .hands { font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th { text-align: left; font-size: 13px; color: #444; border-bottom: 2px solid #999;
     padding: 2px 6px; white-space: nowrap; }
td { border-bottom: 1px solid #ddd; padding: 3px 6px; vertical-align: top;
     white-space: nowrap; }
td.cut { max-width: 210px; overflow: hidden; text-overflow: ellipsis; }
td.chips { white-space: normal; }
.chip { display: inline-block; border-radius: 9px; padding: 0 7px;
        margin: 1px 3px 1px 0; font-size: 13px; white-space: nowrap;
        max-width: 20em; overflow: hidden; text-overflow: ellipsis;
        vertical-align: top; }
.passed { background: #d7f0d8; color: #145a1e; }
.failed { background: #fde2cf; color: #8a3200; }
.hand { display: inline-block; border-radius: 4px; padding: 0 7px; color: #fff;
        font-weight: 700; }
.help { background: #c62828; }
.done { background: #2e7d32; }
.error { color: #b00020; }
.muted { color: #666; font-size: 13px; }
button { font-size: 13px; margin-left: 6px; padding: 0 6px; }
"""

SCRIPT = """
const body = document.body;
const base = body.dataset.base, xsrf = body.dataset.xsrf;
const headers = {"X-XSRFToken": xsrf};

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function ago(seen, now) {
  if (seen === null) return "never";
  const s = Math.max(0, Math.round(now - seen));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

async function clearHand(name) {
  const url = base + "api/hands/" + encodeURIComponent(name) + "/clear";
  const answer = await fetch(url, {method: "POST", headers: headers,
                                   credentials: "same-origin"});
  if (!answer.ok) {
    let why = "HTTP " + answer.status;
    try { why = (await answer.json()).error; } catch (e) {}
    setStatus("could not clear " + name + "'s hand: " + why, true);
  }
  refresh();
}

function setStatus(text, bad) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = bad ? "bad" : "";
}

function cut(text, cls, whole) {
  // One line, cut short on the page; the whole text on hovering.
  const td = el("td", text, "cut " + (cls || ""));
  td.title = whole || text;
  return td;
}

const short = name => name.replace(/\\.ipynb$/, "");

function row(learner, summary, now) {
  const tr = el("tr");
  tr.appendChild(el("td", learner.learner));
  const where = [short(learner.notebook), learner.section].filter(x => x)
    .join(" \\u00b7 ");
  tr.appendChild(where ? cut(where) : el("td", "\\u2013", "muted"));
  const exercises = el("td", null, "chips");
  for (const [name, ex] of Object.entries(learner.exercises)) {
    let text = name + (ex.state === "passed" ? " \\u2713" : " \\u2717 " + ex.failures);
    if (ex.state === "failed" && ex.reason) text += ": " + ex.reason;
    const chip = el("span", text, "chip " + ex.state);
    const after = ex.failures ? " after " + ex.failures + " failed checks" : "";
    chip.title = ex.state === "passed" ? name + ": passed" + after
      : name + ": failed " + ex.failures + " times. " + ex.reason;
    exercises.appendChild(chip);
  }
  if (!Object.keys(learner.exercises).length)
    exercises.appendChild(el("span", "none tried", "muted"));
  tr.appendChild(exercises);
  const quizzes = Object.entries(learner.quizzes)
    .map(([key, q]) => key + ": " + q.right + "/" + q.questions).join(", ");
  tr.appendChild(el("td", quizzes || "\\u2013", quizzes ? "" : "muted"));
  const error = learner.error;
  if (error) {
    const place = [short(error.notebook), error.section].filter(x => x)
      .join(" \\u00b7 ");
    // torch.distributed.DistBackendError: the last name on the page.
    const kind = error.type.split(".").pop();
    tr.appendChild(cut(kind + " in " + place, "error", error.type + " in " + place));
  } else tr.appendChild(el("td", "\\u2013", "muted"));
  const hand = el("td");
  if (learner.hand) {
    hand.appendChild(el("span", learner.hand === "help" ? "I need help" : "done",
                        "hand " + learner.hand));
    const button = el("button", "Clear");
    button.title = "lower " + learner.learner + "'s hand";
    button.onclick = () => clearHand(learner.learner);
    hand.appendChild(button);
  }
  tr.appendChild(hand);
  const job = learner.job;
  tr.appendChild(job ? el("td", job.state + " " + job.left)
    : el("td", summary.jobs_unknown ? "job: unknown (" + summary.jobs_unknown + ")"
                                    : "no job", "muted"));
  tr.appendChild(el("td", ago(learner.seen, now), "muted"));
  return tr;
}

async function refresh() {
  let table;
  try {
    const answer = await fetch(base + "api/table", {headers: headers,
                                                    credentials: "same-origin"});
    if (answer.status === 403) {
      setStatus("the board no longer knows you: reload the page to log in again",
                true);
      return;
    }
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    table = await answer.json();
  } catch (e) {
    setStatus("the board does not answer (" + e.message + "); trying every 2 s",
              true);
    return;
  }
  const summary = document.getElementById("summary");
  const lines = table.summary.lines;
  summary.replaceChildren(...lines.map((line, i) =>
    el("span", line, i === lines.length - 1 ? "hands" : "")));
  const rows = document.getElementById("rows");
  rows.replaceChildren(...table.learners.map(l => row(l, table.summary,
                                                      table.generated)));
  const when = new Date(table.generated * 1000).toLocaleTimeString();
  setStatus(table.summary.learners + " learners \\u00b7 updated " + when, false);
}

refresh();
setInterval(refresh, 2000);
"""


def page_html(base: str, xsrf: str, user: str) -> str:
    """The board's page for the instructor ``user``.

    Args:
        base: the service's URL prefix ("/services/board/"), ending in "/".
        xsrf: the _xsrf token the page's requests send (header X-XSRFToken).
        user: the instructor's hub name, shown at the top.

    Returns:
        The whole HTML document.

    Example:
        >>> "api/table" in page_html("/services/board/", "tok", "teacher")
        True
    """
    attrs = f'data-base="{html.escape(base)}" data-xsrf="{html.escape(xsrf)}"'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Class board</title><style>{STYLE}</style></head>
<body {attrs}>
<header><h1>Class board</h1>
<span id="status">loading&hellip;</span>
<a href="{html.escape(base)}board.csv" download>Export CSV</a>
<span class="muted">signed in as {html.escape(user)}</span></header>
<div id="summary"></div>
<table><thead><tr><th>learner</th><th>notebook &middot; section</th>
<th>exercises</th><th>quiz</th><th>last error</th><th>hand</th><th>job</th>
<th>last seen</th></tr></thead><tbody id="rows"></tbody></table>
<script>{SCRIPT}</script>
</body></html>
"""


def refused_html(sentence: str) -> str:
    """The page a learner (anyone but the instructor) gets, with status 403.

    Example:
        >>> "instructor" in refused_html("the class board is the instructor's")
        True
    """
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Class board</title>
<style>body {{ font: 16px/1.4 system-ui, sans-serif; margin: 40px; }}</style>
</head><body><h1>Class board</h1><p>{html.escape(sentence)}.</p>
<p>Your own progress is in your notebook: <code>workshop.progress()</code>.</p>
</body></html>
"""
