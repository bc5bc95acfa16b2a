"""``tandem up`` as a supervisor, with real processes and the tiny models: a drafter killed (-9) mid-request is
restarted while the request completes target-only; a killed verifier is restarted and the gateway reconnects;
SIGTERM (or SIGKILL) to ``up`` leaves no child behind; a port in use is a clear error, exit code 2."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from procs import REPO, wait_until
from tandem.pb import gateway_grpc, gateway_pb2

N = 256
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process checks use /proc (Linux)")


def req(**kw):
    kw.setdefault("prompt", "w1 w5 w9 w20")
    kw.setdefault("max_tokens", N)
    kw.setdefault("ignore_eos", True)
    return gateway_pb2.GenerateRequest(**kw)


def gone(pid: int) -> bool:
    """No such process any more (or only a zombie: it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def children_of(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return out


def listening_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TANDEM_"))}
    e.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
             PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return e


class Up:
    """``tandem up`` with the tiny models as a child process; its stderr goes to a file the test reads."""

    def __init__(self, target, drafter, tmp_path: Path, *extra: str, separate: bool = True):
        """``separate``: the verifier as a child of its own (--separate-verifier), else in the gateway's."""
        self.log_dir = tmp_path / "logs"
        self.err_path = tmp_path / "up.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "up", "--target", str(target), "--drafter",
                                      str(drafter), "--gateway-port", "0", "--http-port", "0", "--verifier-threads", "1",
                                      "--log-dir", str(self.log_dir), "--startup-timeout", "120",
                                      *(["--separate-verifier"] if separate else []), *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.err, env=env(), cwd=REPO)
        self.gateway = None
        self.seen: set[int] = set()         # every child pid seen: close() leaves none behind, even on old code

    def children(self) -> list[int]:
        pids = children_of(self.proc.pid) if self.proc.poll() is None else []
        self.seen.update(pids)
        return pids

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_up(self, timeout: float = 120.0) -> str:
        ok = wait_until(lambda: "[tandem] up: gateway" in self.stderr() or self.proc.poll() is not None, timeout, 0.2)
        m = re.search(r"up: gateway (\S+)", self.stderr())
        assert ok and m, f"tandem up did not come up:\n{self.stderr()}"
        self.gateway = m.group(1)
        self.children()
        return self.gateway

    def pid(self, name: str) -> int:
        """The pid of up's serve-<name> child now (found in /proc, not in up's own pid files)."""
        for pid in self.children():
            with contextlib.suppress(OSError):
                if f"serve-{name}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    return pid
        raise LookupError(f"tandem up has no {name} child now")

    def close(self) -> None:
        self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in self.seen:
            if not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.err.close()


@pytest.fixture(scope="module")
def up(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path_factory):
    cluster = Up(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path_factory.mktemp("up"))
    try:
        cluster.wait_up()
        with grpc.insecure_channel(cluster.gateway) as channel:
            cluster.stub = gateway_grpc.GatewayStub(channel)
            cluster.plain = cluster.stub.Generate(req(no_speculation=True), timeout=60)
            assert len(cluster.plain.token_ids) == N
            yield cluster
    finally:
        cluster.close()


def test_up_says_where_its_logs_are_and_how_long_each_child_took(up):
    text = up.stderr()
    assert f"logs: {up.log_dir}" in text
    assert re.search(r"verifier \(\S+\) ready in \d+\.\d s \(port \d+\)", text), text
    assert re.search(r"drafter \(\S+\) ready in \d+\.\d s", text) and "gateway ready in" in text, text
    assert (up.log_dir / "up.pid").read_text() == str(up.proc.pid)


def test_a_killed_drafter_is_restarted_while_the_request_completes(up):
    old_pid = up.pid("drafter")
    tokens, last, killed = [], None, False
    for chunk in up.stub.GenerateStream(req(draft_length=4), timeout=60):
        tokens.extend(chunk.token_ids)
        if len(tokens) >= 8 and not killed:
            os.kill(old_pid, signal.SIGKILL)
            killed = True
        last = chunk
    assert tokens == list(up.plain.token_ids), "output differs from --no-speculation after the drafter died"
    assert last.stats.speculative and "drafter unavailable" in last.stats.fallback_reason, last.stats

    assert up.proc.poll() is None, f"tandem up exited:\n{up.stderr()}"
    assert wait_until(lambda: "drafter is back" in up.stderr(), 30, 0.2), up.stderr()
    assert "drafter exited with code -9; restarting in 1 s (log: " in up.stderr()
    assert up.pid("drafter") != old_pid and not gone(up.pid("drafter"))

    # the gateway's probe finds it again: a later request speculates (and still gives the same output)
    def speculates():
        reply = up.stub.Generate(req(draft_length=4), timeout=60)
        speculates.reply = reply
        return reply.stats.speculative and reply.stats.accepted > 0
    assert wait_until(speculates, 30, 0.5), speculates.reply.stats
    assert list(speculates.reply.token_ids) == list(up.plain.token_ids)
    assert up.proc.poll() is None


def test_a_killed_verifier_is_restarted_and_the_gateway_reconnects(up):
    old_pid = up.pid("verifier")
    os.kill(old_pid, signal.SIGKILL)
    assert wait_until(lambda: gone(old_pid), 10)
    with pytest.raises(grpc.RpcError) as err:           # meanwhile: UNAVAILABLE, the gateway itself stays up
        up.stub.Generate(req(max_tokens=8), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value

    assert wait_until(lambda: "verifier is back" in up.stderr(), 45, 0.2), up.stderr()
    assert "verifier exited with code -9; restarting in 1 s" in up.stderr()

    def answers():
        try:
            answers.reply = up.stub.Generate(req(draft_length=4), timeout=60)
            return True
        except grpc.RpcError as exc:
            answers.reply = exc
            return False
    assert wait_until(answers, 20, 0.5), answers.reply
    assert list(answers.reply.token_ids) == list(up.plain.token_ids) and answers.reply.stats.speculative
    assert up.proc.poll() is None


def test_by_default_the_target_runs_in_the_gateway_and_a_killed_gateway_comes_back(tiny_long_target_dir,
                                                                                    tiny_long_drafter_onnx, tmp_path):
    """Two children (drafter, gateway with the target); the same tokens as over gRPC to a verifier of its own;
    the gateway killed (-9) is restarted with its target and serves again."""
    cluster = Up(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path, separate=False)
    try:
        cluster.wait_up()
        assert "verifier in the gateway's process" in cluster.stderr()
        with pytest.raises(LookupError):
            cluster.pid("verifier")
        old_pid = cluster.pid("gateway")
        with grpc.insecure_channel(cluster.gateway) as channel:
            stub = gateway_grpc.GatewayStub(channel)
            plain = stub.Generate(req(no_speculation=True), timeout=60)
            assert len(plain.token_ids) == N
            assert list(stub.Generate(req(draft_length=4), timeout=60).token_ids) == list(plain.token_ids)
        os.kill(old_pid, signal.SIGKILL)
        assert wait_until(lambda: "gateway is back" in cluster.stderr(), 60, 0.2), cluster.stderr()
        with grpc.insecure_channel(cluster.gateway) as channel:
            again = gateway_grpc.GatewayStub(channel).Generate(req(no_speculation=True), timeout=60)
        assert list(again.token_ids) == list(plain.token_ids)
    finally:
        cluster.close()


def test_no_speculation_makes_every_request_plain(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path):
    """``tandem up --no-speculation`` (the README's setting for several clients on one small box): a request
    that asks for nothing, or for a draft length, decodes plain, with plain decoding's tokens."""
    cluster = Up(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path, "--no-speculation", separate=False)
    try:
        cluster.wait_up()
        with grpc.insecure_channel(cluster.gateway) as channel:
            stub = gateway_grpc.GatewayStub(channel)
            for reply in (stub.Generate(req(max_tokens=64), timeout=60),
                          stub.Generate(req(max_tokens=64, draft_length=4), timeout=60)):
                assert not reply.stats.speculative and reply.stats.proposed == 0
                assert len(reply.token_ids) == 64
    finally:
        cluster.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_up_leaves_no_child(sig, tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path):
    """SIGTERM: up stops all three and exits 0. SIGKILL: the kernel tells the children (PR_SET_PDEATHSIG)."""
    cluster = Up(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path)
    try:
        cluster.wait_up()
        pids = {name: cluster.pid(name) for name in ("verifier", "drafter", "gateway")}
        assert not any(gone(p) for p in pids.values())
        cluster.proc.send_signal(sig)
        code = cluster.proc.wait(30)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), cluster.stderr()
        assert wait_until(lambda: all(gone(p) for p in pids.values()), 20, 0.2), \
            {n: p for n, p in pids.items() if not gone(p)}
        if sig == signal.SIGTERM:
            assert "SIGTERM: stopping them all" in cluster.stderr()
    finally:
        cluster.close()


def test_a_port_in_use_is_a_clear_error_before_anything_starts(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path):
    with listening_socket() as s:
        port = s.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "tandem.cli", "up", "--target", str(tiny_long_target_dir),
                              "--drafter", str(tiny_long_drafter_onnx), "--gateway-port", str(port),
                              "--http-port", "-1",
                              "--log-dir", str(tmp_path / "logs")],
                             capture_output=True, text=True, timeout=60, env=env(), cwd=REPO)
    assert res.returncode == 2, res.stderr
    assert f"tandem up: error: port {port} is in use (another `tandem up`?); pick another with --gateway-port" \
        in res.stderr
    assert "Traceback" not in res.stderr
    assert not list((tmp_path / "logs").glob("*.log")), "children were started"


def test_a_childs_bind_failure_is_reported_clearly(tiny_long_target_dir, tiny_long_drafter_onnx, tmp_path,
                                                   monkeypatch):
    """Taken between the check and the gateway's bind: the gateway's own failure says which port and why."""
    from tandem import up as tandem_up

    monkeypatch.setattr(tandem_up, "check_ports", lambda args: None)
    args = SimpleNamespace(target=str(tiny_long_target_dir), drafter=str(tiny_long_drafter_onnx), gateway_port=0,
                           draft_length=2, draft_confidence=0.0, drafter_threads=1, verifier_threads=1,
                           verifier_cpus=None, drafter_cpus=None, startup_timeout=120, log_dir=str(tmp_path),
                           separate_verifier=True)
    with listening_socket() as s:
        args.gateway_port = s.getsockname()[1]
        with pytest.raises(tandem_up.PortInUse, match=rf"the gateway cannot listen on 127\.0\.0\.1:{args.gateway_port} "
                                               r"\(port in use\?\); pick another with --gateway-port"):
            tandem_up.start_cluster(args)
    for name in ("verifier", "drafter", "gateway"):
        assert wait_until(lambda: gone(int((tmp_path / f"{name}.pid").read_text())), 15), name


# ---- without processes -------------------------------------------------------------------------------
def test_restart_backoff_doubles_to_30_s_and_resets_after_a_healthy_while(tmp_path, monkeypatch, capsys):
    from tandem import up_children

    cluster = up_children.Cluster(tmp_path)
    child = cluster.children["drafter"] = up_children.Child("drafter", [], 40000, "drafter")
    spawned = []
    monkeypatch.setattr(cluster, "spawn", lambda name, args: spawned.append(name) or setattr(child, "restart_at", None))
    dead = SimpleNamespace(poll=lambda: -9, returncode=-9)
    waits, now = [], 0.0
    for _ in range(7):
        child.proc = dead
        cluster._watch(child, now)
        waits.append(child.restart_at - now)
        now = child.restart_at
        cluster._watch(child, now)                       # due: started again
    assert waits == [1, 2, 4, 8, 16, 30, 30] and spawned == ["drafter"] * 7 and child.restarts == 7
    assert "drafter exited with code -9; restarting in 16 s (log: " in capsys.readouterr().err

    child.proc, child.healthy_since = SimpleNamespace(poll=lambda: None), now
    cluster._watch(child, now + up_children.RESTART_RESET_S - 1)
    assert child.backoff == 30
    cluster._watch(child, now + up_children.RESTART_RESET_S)
    assert child.backoff == up_children.RESTART_FIRST_S

    child.proc = SimpleNamespace(poll=lambda: 0, returncode=0)         # stopped on purpose: not restarted
    assert cluster._watch(child, now) is None and child.stopped and child.restart_at is None
    gateway = cluster.children["gateway"] = up_children.Child("gateway", [], 50051, "gateway",
                                                    proc=SimpleNamespace(poll=lambda: 0, returncode=0))
    assert cluster._watch(gateway, now) == 0                          # nothing left to serve: up stops


def test_old_log_folders_are_removed_but_the_last_five_and_those_in_use(tmp_path):
    from tandem import up_logs

    now = time.time()
    folders = []
    for i in range(9):                                   # i hours old; the last three two days old
        folder = tmp_path / f"{up_logs.LOG_PREFIX}{i}"
        folder.mkdir()
        (folder / "gateway.log").write_text("x")
        if i == 8:
            (folder / "up.pid").write_text(str(os.getpid()))    # still running: kept whatever its age
        if i == 7:
            (folder / "up.pid").write_text("999999999")         # a run that is gone
        age = i * 3600 if i < 6 else 2 * 86400 + i
        for f in [*folder.iterdir(), folder]:
            os.utime(f, (now - age, now - age))
        folders.append(folder)
    (tmp_path / "unrelated").mkdir()

    removed = up_logs.clean_log_dirs(tmp_path, now=now)
    assert sorted(removed) == sorted(folders[5:8])
    assert all(f.exists() for f in folders[:5]) and folders[8].exists() and (tmp_path / "unrelated").exists()
