"""`tandem up` while it starts: its progress names each service's loading phase, and `tandem generate` called
meanwhile says that `tandem up` is still starting instead of asking whether it runs."""

import socket
import subprocess
import sys

import grpc

from tandem.health import explain
from tandem.up_children import Child, Cluster
from tandem.up_logs import starting_run, write_starting


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_progress_names_the_phase_a_service_logs_last(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.children["verifier"] = Child("verifier", [], 0, "verifier (default)")
    (tmp_path / "verifier.log").write_text("[tandem] phase: reading the file\nsome line\n"
                                           "[tandem] phase: measuring widths\nwarm-up row 3\n")
    assert cluster._loading("verifier") == "verifier (default) (measuring widths)"
    (tmp_path / "verifier.log").write_text("no phase yet\n")
    assert cluster._loading("verifier") == "verifier (default)"


def test_generate_during_start_up_says_tandem_up_is_still_starting(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    port = free_port()                                     # nothing listens there yet: the gateway is not up
    run = tmp_path / "tandem-up-test"
    run.mkdir()
    write_starting(run, port, "loading verifier (measuring widths) ... 12 s")
    message = explain("gateway", f"127.0.0.1:{port}", grpc.StatusCode.UNAVAILABLE)
    assert "still starting" in message and "measuring widths" in message and "is `tandem up`" not in message
    # a run that is gone (its process ended) says nothing: the usual hint comes back
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_starting(run, port, "loading")
    (run / "starting.json").write_text((run / "starting.json").read_text().replace(
        f'"pid": {__import__("os").getpid()}', f'"pid": {dead.stdout.strip()}'))
    assert starting_run(port, tmp_path) is None
    assert "running on that port" in explain("gateway", f"127.0.0.1:{port}", grpc.StatusCode.UNAVAILABLE)
