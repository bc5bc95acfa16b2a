"""Two hosts on one machine: network namespaces joined by a veth pair, the drafter on one "host", the verifier
and the gateway on the other, with added delay on the link (1 ms and 10 ms each way). Greedy speculative
outputs must equal plain decoding at every delay; tokens/s per delay vs loopback are printed (run with -s).

    host A (netns tdm-a-*)  198.18.0.1  drafter (TLS + token)      [+ delay relay, see below]
    host B (netns tdm-b-*)  198.18.0.2  verifier, gateways, a loopback drafter, the client

Addresses come from the benchmarking range 198.18.0.0/15; no traffic leaves the two namespaces the test
creates (deleted at the end, which also removes the veth pair). The delay is `tc qdisc ... netem delay`
on both veth ends where the kernel has sch_netem; where it has not (some VM kernels), a relay in host A
(tests/e2e/netns_relay.py) holds every byte for the delay in each direction instead, and the report says
so. Skipped, with the reason, where network namespaces cannot be created (not root, no iproute2,
no CAP_NET_ADMIN).

Tiny models by default; TANDEM_NETNS_MODEL=default uses the default pair (SmolLM2-135M-Instruct and its
drafter), which takes minutes on a CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import ServiceProcess, wait_until
from tandem.security import make_certs

HERE = Path(__file__).resolve().parent
A_ADDR, B_ADDR = "198.18.0.1", "198.18.0.2"
DELAYS_MS = (1, 10)
TOKEN = "netns-test-token"
REPEATS = int(os.environ.get("TANDEM_NETNS_REPEATS", "2"))


def sh(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


class TwoHosts:
    def __init__(self):
        tag = str(os.getpid() % 100000)
        self.a, self.b = f"tdm-a-{tag}", f"tdm-b-{tag}"
        self.va, self.vb = f"tdma{tag}", f"tdmb{tag}"
        self.netem = False
        self.created: list[str] = []

    def setup(self) -> None:
        for ns in (self.a, self.b):
            r = sh("ip", "netns", "add", ns)
            if r.returncode:
                raise PermissionError(r.stderr.strip())
            self.created.append(ns)
        steps = [("ip", "link", "add", self.va, "type", "veth", "peer", "name", self.vb),
                 ("ip", "link", "set", self.va, "netns", self.a), ("ip", "link", "set", self.vb, "netns", self.b),
                 *[("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up") for ns in (self.a, self.b)],
                 ("ip", "netns", "exec", self.a, "ip", "addr", "add", f"{A_ADDR}/30", "dev", self.va),
                 ("ip", "netns", "exec", self.b, "ip", "addr", "add", f"{B_ADDR}/30", "dev", self.vb),
                 ("ip", "netns", "exec", self.a, "ip", "link", "set", self.va, "up"),
                 ("ip", "netns", "exec", self.b, "ip", "link", "set", self.vb, "up")]
        for step in steps:
            r = sh(*step)
            if r.returncode:
                raise PermissionError(f"{' '.join(step)}: {r.stderr.strip()}")
        r = sh("ip", "netns", "exec", self.a, "tc", "qdisc", "add", "dev", self.va, "root", "netem", "delay", "0ms")
        self.netem = r.returncode == 0
        self.netem_error = r.stderr.strip()
        if self.netem:
            sh("ip", "netns", "exec", self.a, "tc", "qdisc", "del", "dev", self.va, "root")

    def set_netem(self, ms: int) -> None:
        for ns, dev in ((self.a, self.va), (self.b, self.vb)):
            if ms:
                r = sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay",
                       f"{ms}ms")
                assert r.returncode == 0, r.stderr
            else:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root")

    def exec_in(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def teardown(self) -> None:
        for ns in self.created:
            sh("ip", "netns", "del", ns)          # removes the veth end inside it, and so the pair


@pytest.fixture(scope="module")
def hosts():
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces are Linux only")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("iproute2 (ip, tc) is not installed: apt-get install -y iproute2")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root (CAP_NET_ADMIN)")
    h = TwoHosts()
    try:
        h.setup()
    except PermissionError as exc:
        h.teardown()
        pytest.skip(f"this sandbox forbids network namespaces / veth pairs: {exc}")
    yield h
    h.teardown()


@pytest.fixture(scope="module")
def noisy_drafter_onnx(tiny_long_target_dir, tmp_path_factory):
    """The tiny target with noise added to its output head, exported to ONNX: a drafter that agrees with the
    target often but not always (a random tiny drafter never does, which would measure nothing)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tandem.export import export_drafter

    model = LlamaForCausalLM.from_pretrained(tiny_long_target_dir)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=gen) * 0.2)
    src = tmp_path_factory.mktemp("noisy_drafter")
    model.save_pretrained(src)
    AutoTokenizer.from_pretrained(tiny_long_target_dir).save_pretrained(src)
    out = tmp_path_factory.mktemp("noisy_drafter_onnx")
    export_drafter(src, out, check=True)
    return out


def test_two_hosts_with_delay_keep_greedy_outputs_and_report_throughput(hosts, request, tmp_path):
    model = os.environ.get("TANDEM_NETNS_MODEL", "tiny")
    if model == "default":
        target, drafter = "default", "default"
        prompts = ["Write a haiku about autumn.", "Explain what a hash table is in two sentences.",
                   "List three uses of copper."]
        max_tokens, chat, k = 64, True, 4
    else:
        target = str(request.getfixturevalue("tiny_long_target_dir"))
        drafter = str(request.getfixturevalue("noisy_drafter_onnx"))
        prompts = ["w1 w5 w9 w20", "w3 w4", "w7 w7 w8 w30 w31", "w12 w40"]
        max_tokens, chat, k = 128, False, 4

    certs = tmp_path / "certs"
    make_certs(certs, [f"node={A_ADDR},{B_ADDR}"], client=None)
    tls = ["--tls-cert", str(certs / "node.pem"), "--tls-key", str(certs / "node.key"), "--tls-ca", str(certs / "ca.pem")]
    env = {"TANDEM_TOKEN": TOKEN}
    in_a, in_b = hosts.exec_in(hosts.a), hosts.exec_in(hosts.b)
    procs: list = []

    def service(kind, args, name, prefix):
        p = ServiceProcess(kind, [*args, *tls], tmp_path, name=name, prefix=prefix, env=env)
        procs.append(p)
        return p

    relay = None
    try:
        verifier = service("verifier", ["--target", target, "--port", "0", "--threads", "1"], "verifier", in_b)
        remote = service("drafter", ["--drafter", drafter, "--host", A_ADDR, "--port", "0", "--threads", "1"],
                         "drafter-a", in_a)
        local = service("drafter", ["--drafter", drafter, "--port", "0", "--threads", "1"], "drafter-b", in_b)
        v_port, r_port, l_port = verifier.wait_port(600), remote.wait_port(600), local.wait_port(600)

        gw_args = ["--verifier", f"127.0.0.1:{v_port}", "--port", "0", "--max-tokens-limit", "512",
                   "--draft-length", str(k)]
        gateways = {"loopback": service("gateway", [*gw_args, "--drafter", f"127.0.0.1:{l_port}"], "gw-loopback", in_b),
                    "veth": service("gateway", [*gw_args, "--drafter", f"{A_ADDR}:{r_port}"], "gw-veth", in_b)}
        delay_file = tmp_path / "delay_ms"
        if hosts.netem:
            how = "tc netem on both veth ends"
            gateways["delayed"] = gateways["veth"]
        else:
            how = f"userspace relay in host A (no kernel netem: {hosts.netem_error!r})"
            delay_file.write_text("0")
            relay_port_file = tmp_path / "relay.port"
            relay = subprocess.Popen([*in_a, sys.executable, str(HERE / "netns_relay.py"), "--listen", A_ADDR,
                                      "--port-file", str(relay_port_file), "--to", f"{A_ADDR}:{r_port}",
                                      "--delay-file", str(delay_file)], stdout=subprocess.DEVNULL,
                                     stderr=open(tmp_path / "relay.log", "w"))
            assert wait_until(lambda: relay_port_file.exists() and relay_port_file.read_text().strip(), 30)
            gateways["delayed"] = service("gateway", [*gw_args, "--drafter",
                                                      f"{A_ADDR}:{relay_port_file.read_text().strip()}"],
                                          "gw-delayed", in_b)
        gw_ports = {name: gw.wait_port(600) for name, gw in gateways.items()}

        def run_client(gateway: str, *extra: str) -> dict:
            r = subprocess.run([*in_b, sys.executable, str(HERE / "netns_client.py"), "--gateway",
                                f"127.0.0.1:{gw_ports[gateway]}", "--ca", str(certs / "ca.pem"),
                                "--prompts-json", json.dumps(prompts), "--max-tokens", str(max_tokens),
                                *(["--chat"] if chat else []), *extra],
                               capture_output=True, text=True, timeout=1800, env=dict(os.environ, **env))
            assert r.returncode == 0, r.stderr[-3000:]
            return json.loads(r.stdout.strip().splitlines()[-1])

        def set_delay(ms: int) -> None:
            if hosts.netem:
                hosts.set_netem(ms)
            else:
                delay_file.write_text(str(ms))
                time.sleep(0.2)                       # the relay re-reads it every 50 ms

        # Each configuration REPEATS times, interleaved, keeping the fastest run: the machine is shared.
        plan = [("plain (target only)", "loopback", 0, ["--no-speculation"]), ("loopback", "loopback", 0, []),
                ("veth, no added delay", "veth", 0, []),
                *[(f"veth, {ms} ms each way", "delayed", ms, []) for ms in DELAYS_MS]]
        results: dict[str, dict] = {}
        for _ in range(REPEATS):
            for name, gateway, ms, extra in plan:
                set_delay(ms)
                r = run_client(gateway, *extra)
                if name in results:
                    assert r["outputs"] == results[name]["outputs"], f"{name}: outputs differ between runs"
                if name not in results or r["seconds"] < results[name]["seconds"]:
                    results[name] = r
        set_delay(0)
    finally:
        for p in procs:
            p.close()
        if relay is not None:
            relay.terminate()
            try:
                relay.wait(10)
            except subprocess.TimeoutExpired:
                relay.kill()

    plain = results["plain (target only)"]
    lines = [f"[netns] model {model}, {len(prompts)} prompts x {max_tokens} tokens, greedy, k={k}, TLS + token, "
             f"best of {REPEATS}; delay by {how}"]
    base = results["loopback"]["tokens"] / results["loopback"]["seconds"]
    for name, r in results.items():
        tps = r["tokens"] / r["seconds"]
        tau = 1 + r["accepted"] / r["rounds"] if r["rounds"] else 1.0
        lines.append(f"[netns]   {name:<24} {tps:7.1f} tok/s  ({tps / base:4.2f}x loopback)  "
                     f"mean acceptance length {tau:.2f}")
    print("\n" + "\n".join(lines))
    (tmp_path / "netns_results.txt").write_text("\n".join(lines) + "\n")
    for name, r in results.items():
        assert r["outputs"] == plain["outputs"], f"{name}: greedy output differs from plain decoding"
        if name != "plain (target only)":
            assert all(r["speculative"]) and not any(r["fallback"]), (name, r["fallback"])
