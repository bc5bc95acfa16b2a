"""Starting child processes from a process that runs gRPC, without running code between fork and exec.

``subprocess.Popen(preexec_fn=...)`` makes CPython use ``fork()``, and ``fork()`` runs gRPC core's
``pthread_atfork`` handlers. In grpcio 1.85 the child's handler restarts the event engine's poller
threads, and CPython then closes the inherited descriptors (``close_fds``) under them: the child dies
of SIGSEGV or SIGABRT ("epoll_wait error: Bad file descriptor") before it reaches ``exec``
(grpc/grpc#43055; a one-line ``preexec_fn`` is enough: BENCHMARKS.md, twenty-second session). Without a
``preexec_fn`` CPython uses ``vfork()``, which runs no handlers.

So every child of ``tandem up`` and ``tandem bench`` starts through :func:`popen`, which takes no
``preexec_fn``. What the old preexec functions did in the child happens after ``exec`` instead, in a
small trampoline (``python -m tandem.spawn``) that then execs the real command in the same process:

- ``cpus``: pin to these CPUs (every thread the command starts inherits the set);
- ``die_with_parent``: the kernel sends SIGTERM when the spawning thread of this process ends, even by
  SIGKILL (``PR_SET_PDEATHSIG``, Linux; it survives ``exec``);
- ``new_group``: its own process group (``process_group=0``, set by CPython without a preexec), so
  that a terminal's Ctrl-C reaches the parent alone.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


def popen(cmd: list[str], *, cpus: str | None = None, die_with_parent: bool = False, new_group: bool = False,
          **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)``, pinned to ``cpus``, killed with its parent, in its own process
    group, as asked; never through a ``preexec_fn`` (see the module docstring)."""
    if "preexec_fn" in kwargs:
        raise TypeError("tandem.spawn.popen takes no preexec_fn: it is what this module avoids")
    return subprocess.Popen(wrap(cmd, cpus=cpus, die_with_parent=die_with_parent), **kwargs,
                            **({"process_group": 0} if new_group and os.name == "posix" else {}))


def run(cmd: list[str], *, cpus: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` with the same pinning as :func:`popen`."""
    return subprocess.run(wrap(cmd, cpus=cpus), **kwargs)


def wrap(cmd: list[str], *, cpus: str | None = None, die_with_parent: bool = False) -> list[str]:
    """``cmd`` itself when nothing is asked of the child, else the trampoline's command line around it.
    ``die_with_parent`` applies on Linux when spawning from the main thread only (the signal follows the
    spawning *thread*, and a worker thread may end long before the parent)."""
    death = (die_with_parent and sys.platform.startswith("linux")
             and threading.current_thread() is threading.main_thread())
    if not cpus and not death:
        return list(cmd)
    head = [sys.executable, "-m", "tandem.spawn"]
    if cpus:
        head += ["--cpus", str(cpus)]
    if death:
        head += ["--parent", str(os.getpid())]
    return [*head, "--", *cmd]


def _die_with(parent: int) -> None:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:           # the parent died before the line above took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tandem.spawn",
                                description="Pins this process and/or ties it to its parent, then execs COMMAND "
                                            "in its place (used by tandem up and tandem bench).")
    p.add_argument("--cpus", help="CPU list to pin to, e.g. 1 or 0-3,6")
    p.add_argument("--parent", type=int, help="pid of the parent: SIGTERM when it dies (Linux)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given after --")
    if args.cpus:
        from tandem.affinity import pin_to_cpus
        try:
            pin_to_cpus(args.cpus)
        except (RuntimeError, ValueError) as e:
            sys.exit(f"tandem.spawn: cannot pin {command[0]} to CPUs {args.cpus}: {e}")
    if args.parent is not None:
        _die_with(args.parent)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.exit(f"tandem.spawn: cannot run {command[0]}: {e}")


if __name__ == "__main__":
    main()
