"""--cpus pins a real service process, every thread of it, before it serves (how `tandem bench
--verifier-cpus/--drafter-cpus` keeps the drafter off the verifier's cores); bad lists are refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import ServiceProcess

from tandem.affinity import format_cpus, parse_cpus

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU pinning is Linux-only")


def test_parse_and_format_cpu_lists():
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    assert parse_cpus(" 3 ") == {3}
    assert format_cpus({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    for bad in ("", "a", "1-", "3-1", "1,,x", "-2"):
        with pytest.raises(ValueError, match="CPU"):
            parse_cpus(bad)


def _thread_cpus(pid: int) -> set[str]:
    lists = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                lists.add(line.split(":", 1)[1].strip())
    return lists


def test_served_drafter_and_all_its_threads_stay_on_the_pinned_cpu(tiny_drafter_onnx, tmp_path):
    cpu = max(os.sched_getaffinity(0))   # a CPU this test may use, and not (only) the default of all
    service = ServiceProcess("drafter", ["--drafter", str(tiny_drafter_onnx), "--threads", "2", "--cpus", str(cpu),
                                         "--port", "0"], tmp_path)
    try:
        service.wait_port(60)
        # the ONNX Runtime pool, the gRPC server's threads and the main thread: one CPU for all
        assert _thread_cpus(service.proc.pid) == {str(cpu)}
        assert len(list(Path(f"/proc/{service.proc.pid}/task").iterdir())) > 1
    finally:
        service.close()
    assert service.proc.returncode == 0, service.tail()


def test_unavailable_cpu_is_refused_with_a_message(tiny_drafter_onnx):
    missing = max(os.sched_getaffinity(0)) + 1000
    res = subprocess.run([sys.executable, "-m", "tandem.cli", "serve-drafter", "--drafter", str(tiny_drafter_onnx),
                          "--cpus", str(missing), "--port", "0"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert res.returncode == 2
    assert f"--cpus: CPUs {missing} are not available to this process" in res.stderr


def test_up_refuses_a_bad_cpu_list_before_starting_anything():
    from types import SimpleNamespace

    from tandem.up import start_cluster

    args = SimpleNamespace(log_dir=None, startup_timeout=5, target="default", drafter="default", verifier_threads=1,
                           drafter_threads=1, gateway_port=0, draft_length=2, draft_confidence=0.0,
                           verifier_cpus="0", drafter_cpus="2-1")
    with pytest.raises(ValueError, match="--drafter-cpus: bad CPU range"):
        start_cluster(args)
