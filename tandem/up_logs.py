"""The log folders of ``tandem up`` and its ``starting.json``: where each run writes its children's logs and pid
files, which old folders are removed, and the state file that tells ``tandem generate`` a run is still starting.

A run without ``--log-dir`` writes into a new ``tandem-up-*`` folder in the temporary directory; of the
folders no live run uses, the latest few are kept and none older than a day. While the children load, the
folder holds ``starting.json`` (gateway port, what is loading, the pid of ``up``), so that ``tandem generate``
against that port says ``up`` is still starting instead of asking whether it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

LOG_PREFIX = "tandem-up-"       # default log folders: <tmp>/tandem-up-XXXX
KEEP_LOG_DIRS = 5               # old log folders kept (those of runs still going are never removed) ...
LOG_DIR_MAX_AGE_S = 24 * 3600   # ... and none older than this
STATE_FILE = "starting.json"    # in the log folder while the children load: what `tandem generate` reports


# ---- log folders ---------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use(folder: Path) -> bool:
    """A folder of a run still going: its ``up.pid`` or a child's ``<name>.pid`` names a live process."""
    for pid_file in folder.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if _alive(int(pid_file.read_text().strip())):
                return True
    return False


def _last_write(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for f in folder.iterdir():
        with contextlib.suppress(OSError):
            times.append(f.stat().st_mtime)
    return max(times)


# ---- starting.json -------------------------------------------------------------------------------
def write_starting(log_dir: Path, gateway_port: int, what: str) -> None:
    """Records that this run is still starting (``what``: who loads, in which phase, for how long)."""
    with contextlib.suppress(OSError):
        (log_dir / STATE_FILE).write_text(json.dumps({"gateway_port": gateway_port, "what": what, "pid": os.getpid()}))


def starting_run(gateway_port: int, root: str | Path | None = None) -> str | None:
    """What a `tandem up` of this user that serves ``gateway_port`` and is still starting is doing (None: none
    is): `tandem generate` says so instead of asking whether `tandem up` runs."""
    root = Path(root or tempfile.gettempdir())
    for folder in root.glob(LOG_PREFIX + "*"):
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((folder / STATE_FILE).read_text())
            if state.get("gateway_port") == gateway_port and _alive(int(state["pid"])):
                return f"tandem up (pid {state['pid']}) is still starting: {state['what']}"
    return None


# ---- cleaning ------------------------------------------------------------------------------------
def clean_log_dirs(root: str | Path | None = None, keep: int = KEEP_LOG_DIRS, max_age_s: float = LOG_DIR_MAX_AGE_S,
                   now: float | None = None) -> list[Path]:
    """Removes this user's old ``tandem-up-*`` folders in ``root`` (the temporary directory): of those no run
    uses any more, all but the ``keep`` latest, and any older than ``max_age_s``. Returns what it removed."""
    root = Path(root or tempfile.gettempdir())
    now = time.time() if now is None else now
    idle = []
    for folder in root.glob(LOG_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid() \
                    and not _in_use(folder):
                idle.append((_last_write(folder), folder))
    idle.sort(reverse=True)
    removed = []
    for rank, (written, folder) in enumerate(idle):
        if rank >= keep or now - written > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed

