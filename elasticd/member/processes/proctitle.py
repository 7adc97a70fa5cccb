"""Process titles: how the zygote and its forked workers show in ps, top, pkill -f, py-spy and nvidia-smi."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

import setproctitle

_PR_SET_NAME = 15
# Blank argv bytes the zygote starts with, so setproctitle has room without taking over the environment block
# (SPT_NOENV): /proc/PID/environ of the zygote and its workers keeps the job id that tools match on.
TITLE_ROOM = 4096
_ELLIPSIS = " ..."


def worker_title(python: str, entry: list[str], env: Mapping[str, str], limit: int) -> str:
    """`python -u ENTRY` as torchrun's worker shows in ps, then where it belongs; long arguments give way to the tag."""
    tag = (f" [elastic job={env.get('ELASTICD_JOB_ID', '?')} node={env.get('ELASTICD_NODE_ID', '?')} "
           f"rank={env.get('RANK', '?')} round={env.get('ELASTICD_ROUND', '?')}]")
    command = " ".join([python, "-u", *entry])
    if len(command) + len(tag) > limit:
        command = command[:max(0, limit - len(tag) - len(_ELLIPSIS))] + _ELLIPSIS
    return command + tag


def zygote_title(env: Mapping[str, str]) -> str:
    return f"elasticd zygote job={env.get('ELASTICD_JOB_ID', '?')} node={env.get('ELASTICD_NODE_ID', '?')}"


def title_limit() -> int:
    """Characters a title may have: setproctitle writes it, and a NUL after it, inside the argv strings' block."""
    return len(os.fsencode("\0".join(sys.orig_argv))) - 1


def set_title(title: str) -> None:
    setproctitle.setproctitle(title)


def name_kernel_task(name: str) -> None:
    """The 15-byte comm that `top` and `ps -o comm` show; setproctitle leaves a cut-off python path there."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def reexec_with_title_room() -> None:
    """Start this interpreter over once, same pid and fds, with TITLE_ROOM blank bytes of argv to write titles in."""
    if sys.argv[-1].isspace():
        return
    env = {**os.environ, "SPT_NOENV": "1"}
    os.execve(sys.executable, [*sys.orig_argv, " " * TITLE_ROOM], env)
