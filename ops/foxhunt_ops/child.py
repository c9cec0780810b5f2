"""A trial's process: ``python -m foxhunt_ops.child train ...`` is ``foxhunt train ...`` that dies with its parent.

On Linux the process first asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), then checks that the parent named in ``FOXHUNT_TRIAL_PARENT`` is still
its parent (it may have died between the fork and the request). Done here rather than in a
``preexec_fn``, which is unsafe in a threaded parent such as a Ray worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "FOXHUNT_TRIAL_PARENT"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    parent = os.environ.get(PARENT_ENV)
    if parent is not None and os.getppid() != int(parent):
        os._exit(1)


def main() -> None:
    die_with_parent()
    from foxhunt_core.cli import main as cli_main

    cli_main(prog_name="foxhunt")


if __name__ == "__main__":
    main()
