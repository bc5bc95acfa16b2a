"""Children of a process that runs gRPC start through ``tandem.spawn``: no code between fork and exec, so
gRPC's fork handlers cannot kill them (grpc/grpc#43055), and they are still pinned, tied to their parent
and in their own process group as asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent import futures

import grpc
import pytest

from tandem import spawn

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process controls")


@pytest.fixture
def busy_grpc():
    """A gRPC server and a channel calling it all the time from another thread (as in ``tandem up``,
    whose health checks and restarts overlap)."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stop = threading.Event()

    def poke():
        call = channel.unary_unary("/tandem.Nothing/Here")
        while not stop.is_set():
            try:
                call(b"", timeout=0.05)
            except grpc.RpcError:
                pass

    thread = threading.Thread(target=poke, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(5)
    channel.close()
    server.stop(0)


@linux
def test_children_of_a_busy_grpc_process_all_start(busy_grpc):
    """60 children with every option: each one runs its command. With a ``preexec_fn`` doing as little as
    ``os.setpgid(0, 0)``, 22 of 150 died here before exec (SIGSEGV / SIGABRT)."""
    codes = []
    for _ in range(60):
        p = spawn.popen([sys.executable, "-c", "print('ran')"], cpus=str(min(os.sched_getaffinity(0))),
                        die_with_parent=True, new_group=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL)
        out, _ = p.communicate(timeout=60)
        codes.append((p.returncode, out.decode(errors="replace").strip()[-200:]))
    assert [c for c in codes if c != (0, "ran")] == []


def test_popen_refuses_a_preexec_fn():
    with pytest.raises(TypeError, match="preexec_fn"):
        spawn.popen(["true"], preexec_fn=lambda: None)


def test_nothing_asked_runs_the_command_itself():
    assert spawn.wrap(["llama-server", "-m", "x"]) == ["llama-server", "-m", "x"]


@linux
def test_the_child_is_pinned_and_in_its_own_process_group():
    cpu = max(os.sched_getaffinity(0))
    p = spawn.popen([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), os.getpgid(0) == os.getpid())"],
                    cpus=str(cpu), new_group=True, stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=60)
    assert out.decode().split() == [f"[{cpu}]", "True"]


@linux
def test_a_cpu_it_may_not_use_is_a_clear_error():
    bad = max(os.sched_getaffinity(0)) + 1000
    r = spawn.run(["true"], cpus=str(bad), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"cannot pin true to CPUs {bad}" in r.stderr


@linux
def test_a_child_dies_with_its_parent_even_by_sigkill(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from tandem import spawn
        child = spawn.popen(["sleep", "120"], die_with_parent=True)
        print(child.pid, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):   # gone, not yet reaped by init
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its SIGKILLed parent")


@linux
def test_a_missing_command_is_a_clear_error():
    r = spawn.run(["/nonexistent/llama-server"], cpus=str(min(os.sched_getaffinity(0))), capture_output=True,
                  text=True, timeout=60)
    assert r.returncode == 1 and "cannot run /nonexistent/llama-server" in r.stderr
