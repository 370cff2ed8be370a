"""workshop.instructor.portal_endings: how a learner's server job ended, in words, from
``scontrol show job`` text recorded on the private cluster (Slurm 22.05). The portal's
own cancelled job, seen by the learner, is in test_portal.py."""

from __future__ import annotations

import datetime as dt

from workshop.instructor import portal_endings
from workshop.instructor.portal_endings import Ending, describe, parse_job

DAY = dt.date(2026, 11, 29)

# A learner's server job after `scancel 7` as root: the whole record.
CANCELLED = """\
JobId=7 JobName=jupyter-pupil02
   UserId=pupil02(1003) GroupId=pupil02(1003) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=CANCELLED Reason=None Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15
   RunTime=00:00:21 TimeLimit=02:00:00 TimeMin=N/A
   SubmitTime=2026-11-29T02:22:31 EligibleTime=2026-11-29T02:22:31
   AccrueTime=2026-11-29T02:22:31
   StartTime=2026-11-29T02:22:31 EndTime=2026-11-29T02:22:52 Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T02:22:31 Scheduler=Main
   Partition=debug AllocNode:Sid=localhost:3046
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=127.0.0.2
   BatchHost=127.0.0.2
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,node=1,billing=1
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Features=(null) DelayBoot=00:00:00
   OverSubscribe=YES Contiguous=0 Licenses=(null) Network=(null)
   Command=(null)
   WorkDir=/tmp/wp-x/home/pupil02
   StdErr=/tmp/wp-x/home/pupil02/jupyter-7.log
   StdIn=/dev/null
   StdOut=/tmp/wp-x/home/pupil02/jupyter-7.log
   Power=
"""

# The lines that differ, from jobs that reached --time=1, exited with status 3, and
# lost their node (scontrol update nodename=127.0.0.3 state=down).
TIMEOUT = """\
JobId=2 JobName=wrap
   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15
   RunTime=00:01:16 TimeLimit=00:01:00 TimeMin=N/A
   StartTime=2026-11-29T02:19:22 EndTime=2026-11-29T02:20:38 Deadline=N/A
"""
FAILED = """\
JobId=3 JobName=wrap
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0
   StartTime=2026-11-29T02:19:22 EndTime=2026-11-29T02:19:23 Deadline=N/A
"""
NODE_FAIL = """\
JobId=5 JobName=wrap
   JobState=NODE_FAIL Reason=NodeDown Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15
   StartTime=2026-11-29T02:19:31 EndTime=2026-11-29T02:19:33 Deadline=N/A
   NodeList=127.0.0.3
"""


def test_the_fields_of_scontrol_show_job_are_read_whole():
    fields = parse_job(CANCELLED)
    assert fields["JobId"] == "7"
    assert fields["JobState"] == "CANCELLED"
    assert fields["EndTime"] == "2026-11-29T02:22:52"
    assert fields["TRES"] == "cpu=1,node=1,billing=1"  # '=' inside a value
    assert fields["AllocNode:Sid"] == "localhost:3046"
    assert fields["StdOut"] == "/tmp/wp-x/home/pupil02/jupyter-7.log"
    assert fields["Power"] == ""


def test_a_cancel_names_who_cancelled_from_the_learners_side(monkeypatch):
    fields = parse_job(CANCELLED)
    names = {0: "root", 1003: "pupil02", 1010: "teacher", 1011: "pupil05"}

    class Entry:
        def __init__(self, uid):
            self.pw_name = names[uid]

    monkeypatch.setattr(portal_endings.pwd, "getpwuid", Entry)
    said = {
        uid: describe(fields, "pupil02", uid, "teacher", DAY).sentence()
        for uid in (0, 1003, 1010, 1011, None)
    }
    assert said[0] == (
        "Your server's Slurm job 7 ended at 02:22: it was cancelled (scancel by "
        "root: the instructor or an administrator)."
    )
    assert said[1003].endswith("it was cancelled (scancel by you).")
    assert said[1010].endswith("(scancel by the instructor (teacher)).")
    assert said[1011].endswith("(scancel by pupil05).")
    assert said[None].endswith("ended at 02:22: it was cancelled (scancel).")
    assert describe(fields, "pupil02").log == "/tmp/wp-x/home/pupil02/jupyter-7.log"


def test_a_time_limit_a_failure_and_a_lost_node_say_so():
    def said(text):
        return describe(parse_job(text), "pupil02", today=DAY).sentence()

    assert said(TIMEOUT) == (
        "Your server's Slurm job 2 ended at 02:20: it reached its time limit of "
        "00:01:00."
    )
    assert said(FAILED).endswith("ended at 02:19: the server exited with code 3.")
    assert said(NODE_FAIL).endswith(
        "ended at 02:19: its node 127.0.0.3 failed (Slurm's reason: NodeDown)."
    )
    killed = FAILED.replace("ExitCode=3:0", "ExitCode=0:9")
    assert said(killed).endswith("the server was stopped by signal 9 (SIGKILL).")


def test_other_endings_and_a_forgotten_job_still_give_a_sentence():
    ended = "2026-11-28T16:40:00"
    other_day = {"JobId": "9", "JobState": "COMPLETED", "EndTime": ended}
    assert describe(other_day, "pupil02", today=DAY).sentence() == (
        "Your server's Slurm job 9 ended at 2026-11-28 16:40: the server shut "
        "itself down (File > Shut Down in JupyterLab)."
    )
    odd = {"JobId": "9", "JobState": "SPECIAL_EXIT", "Reason": "x", "EndTime": ended}
    assert (
        describe(odd, "pupil02", today=DAY).why
        == "Slurm's state SPECIAL_EXIT (reason: x)"
    )
    forgotten = describe({"JobId": "9"}, "pupil02")
    assert (forgotten.at, forgotten.state) == ("", "")
    assert forgotten.sentence() == (
        "Your server's Slurm job 9 ended: Slurm no longer remembers how (it forgets "
        "a finished job after MinJobAge, 5 minutes by default)."
    )
    assert Ending(**forgotten.as_state()) == forgotten  # what the hub stores


def test_who_cancelled_comes_from_sacct_else_the_controllers_log(tmp_path, monkeypatch):
    log = tmp_path / "slurmctld.log"
    log.write_text(
        "[2026-11-29T02:19:12.438] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=71 "
        "uid 1003\n"
        "[2026-11-29T02:22:52.001] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=7 "
        "uid 0\n"
    )
    # A site with accounting: sacct's State says who.
    asked = []

    def sacct(cmd, timeout=15):
        asked.append(cmd)
        return 0, "CANCELLED by 1003\n"

    monkeypatch.setattr(portal_endings, "_run", sacct)
    assert portal_endings.cancelled_by("7", str(log)) == 1003
    assert asked[0][:2] == ["sacct", "-n"] and "7" in asked[0]
    # Without accounting (the private cluster: sacct fails), the controller's log.
    no_accounting = (1, "Slurm accounting storage is disabled\n")
    monkeypatch.setattr(portal_endings, "_run", lambda cmd, timeout=15: no_accounting)
    assert portal_endings.cancelled_by("7", str(log)) == 0
    assert portal_endings.cancelled_by("71", str(log)) == 1003
    assert portal_endings.cancelled_by("8", str(log)) is None
    assert portal_endings.cancelled_by("7", str(tmp_path / "none")) is None
