"""The two-machine recipe of deploy/TWO_MACHINES.md, run exactly as written.

The code blocks marked ``<!-- recipe: gpu-box -->`` / ``<!-- recipe: drafter-box -->`` are parsed out of
the markdown and run by bash, in document order, each in its machine's own folder (its checkout: certs,
token, env), with TLS and the token as the recipe sets them up. So the doc and the test cannot drift.
The only changes, all made here and listed:

- host names (gpu-box.lan, drafter-box.lan) become 127.0.0.1 (the certificates are valid for it too),
  and the ports 50051/50061/50062 free ones (other tests may hold the defaults);
- ``--device cuda`` becomes ``--device cpu`` where torch sees no GPU;
- ``.venv/bin/tandem`` in each folder runs this checkout's ``python -m tandem.cli``; ``scp`` copies into
  the drafter machine's folder (its home: ``drafter-box/``);
- tiny models stand in for the defaults through the documented variables: ``TANDEM_TARGET`` on the GPU
  machine, ``TANDEM_DRAFTER`` (a folder, on the drafter machine only).

Background services (``... &``) are stopped at the end through each block's process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "deploy" / "TWO_MACHINES.md"
HOSTS = ("gpu-box.lan", "drafter-box.lan")
PORTS = ("50051", "50061", "50062")


def recipe_blocks(text: str) -> list[tuple[str, str]]:
    """(machine, bash code) of each ```bash block right after a ``<!-- recipe: MACHINE -->`` comment."""
    return re.findall(r"<!-- recipe: ([\w-]+) -->\s*\n```bash\n(.*?)\n```", text, flags=re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapt(code: str, ports: dict[str, str], gpu: bool) -> str:
    for host in HOSTS:
        code = code.replace(host, "127.0.0.1")
    for old, new in ports.items():
        code = re.sub(rf"(?<!\d){old}(?!\d)", new, code)
    if not gpu:
        code = code.replace("--device cuda", "--device cpu")
    return code


def make_machine(root: Path, name: str) -> Path:
    """``root/name/tandem``: the machine's checkout, with a ``.venv/bin/tandem`` running this one, and the tracked
    files of ``deploy/`` a fresh clone has (the certificates' folder among them)."""
    checkout = root / name / "tandem"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    tracked = subprocess.run(["git", "ls-files", "deploy"], cwd=REPO, capture_output=True, text=True, check=True)
    for rel in tracked.stdout.split():
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, checkout / rel)
    shim = checkout / ".venv" / "bin" / "tandem"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tandem.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return checkout


SCP_SHIM = """#!/bin/sh
# scp FILE... HOST:PATH -> copies into the drafter machine's home folder (the test's stand-in); like scp, it
# makes no folder: a destination folder missing on the drafter machine fails
for last; do :; done
dest="$DRAFTER_HOME/${last#*:}"
[ -d "$dest" ] || { echo "scp: $dest: No such file or directory" >&2; exit 1; }
while [ $# -gt 1 ]; do cp "$1" "$dest"; shift; done
"""


def test_blocks_are_found():
    blocks = recipe_blocks(DOC.read_text())
    assert [m for m, _ in blocks] == ["gpu-box", "drafter-box", "gpu-box", "drafter-box"]
    assert any("serve-drafter" in code for _, code in blocks) and any("generate" in code for _, code in blocks)


def test_two_machine_recipe_as_written(tiny_target_dir, tiny_drafter_onnx, tmp_path):
    import torch

    blocks = recipe_blocks(DOC.read_text())
    ports = {p: str(free_port()) for p in PORTS}
    machines = {name: make_machine(tmp_path, name) for name in ("gpu-box", "drafter-box")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scp").write_text(SCP_SHIM)
    (bin_dir / "scp").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "OTEL_"))}
    base.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
                PATH=f"{bin_dir}{os.pathsep}{base.get('PATH', '')}", DRAFTER_HOME=str(tmp_path / "drafter-box"),
                PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env = {"gpu-box": dict(base, TANDEM_TARGET=str(tiny_target_dir), TANDEM_THREADS="1"),
           "drafter-box": dict(base, TANDEM_DRAFTER=str(tiny_drafter_onnx))}
    shells: list[subprocess.Popen] = []
    outputs: list[Path] = []
    try:
        for i, (machine, code) in enumerate(blocks):
            script = tmp_path / f"block{i}-{machine}.sh"
            script.write_text("set -eu\n" + adapt(code, ports, torch.cuda.is_available()) + "\n")
            out = tmp_path / f"block{i}-{machine}.log"
            outputs.append(out)
            with open(out, "w") as log:
                shell = subprocess.Popen(["bash", str(script)], cwd=machines[machine], env=env[machine],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            shells.append(shell)
            try:
                rc = shell.wait(240)
            except subprocess.TimeoutExpired:
                rc = None
            assert rc == 0, f"block {i} ({machine}) ended with {rc}:\n{script.read_text()}\n--- output:\n" \
                            f"{out.read_text()[-4000:]}"
        client = outputs[-1].read_text()
        assert "speculative (drafter" in client, client          # TLS + token to the drafter, across "machines"
        assert "tokens in" in client
        # what the recipe promised: the CA key stayed on the GPU machine, the drafter got only its own files
        certs = machines["drafter-box"] / "deploy" / "certs"
        assert sorted(p.name for p in certs.iterdir()) == ["README.md", "ca.pem", "drafter-box.key", "drafter-box.pem",
                                                           "token"]
    finally:
        for shell in shells:                                       # the services the blocks left running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
        end = time.monotonic() + 15
        for shell in shells:
            while time.monotonic() < end:
                try:
                    os.killpg(shell.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
        shutil.rmtree(tmp_path / "gpu-box" / "tandem" / "deploy" / "certs", ignore_errors=True)
