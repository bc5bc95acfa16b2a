"""``tandem up`` / ``tandem demo``: the services as local processes on loopback: the drafter, and the gateway
with the target in its own process (``--separate-verifier``: the verifier as a third process).

``up`` checks its flags and ports before starting anything, starts the drafter (and a separate verifier), then
the gateway pointed at them, and supervises them until a signal stops them (``tandem.up_children``:
restarts, health, stop order; ``tandem.up_signals``: SIGTERM / SIGHUP / SIGINT; ``tandem.up_logs``: log
folders and the ``starting.json`` that ``tandem generate`` reads while they load). ``demo`` starts them
the same way, generates once with a round timeline, and stops them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from gateway.cli import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_HTTP_PORT
from tandem.affinity import check_cpus, cores_shared
from tandem.flags import DEFAULT_HOST, draft_length, flag
from tandem.up_children import Cluster, PortInUse, StartupFailed, note
from tandem.up_logs import KEEP_LOG_DIRS, LOG_PREFIX, STATE_FILE, clean_log_dirs, write_starting
from tandem.up_signals import Stop, stop_on_signals


# ---- flags ---------------------------------------------------------------------------------------
def configure(p):
    flag(p, "target", "default", help="target model for the verifier ('default', .gguf or HF dir)")
    flag(p, "drafter", "default", help="drafter for the drafter service ('default' or a path)")
    flag(p, "gateway-port", 50051, int, help="gateway port (drafter and verifier take free ports)")
    flag(p, "draft-length", "auto", draft_length, help="draft length of every round: 'auto' (chosen each round "
         "from measured costs and acceptance; a plain step where speculation does not pay) or a fixed k")
    flag(p, "max-draft-length", 8, int, help="the longest block auto drafts")
    flag(p, "http-port", DEFAULT_HTTP_PORT, int, help="the gateway's OpenAI-compatible HTTP API and chat page "
         "(http://127.0.0.1:PORT/; -1: off)")
    flag(p, "draft-confidence", DEFAULT_DRAFT_CONFIDENCE, float, help="adaptive draft length: the drafter stops a "
         "block before a token it is less sure of than this (0 = always k)")
    flag(p, "unseeded-sampling", "coupled", help="a sampled request without a seed: 'coupled' (a secret seed: "
         "the drafter can only cost speed) or 'rejection' (trusts the drafter's q); the gateway's "
         "--unseeded-sampling", choices=("coupled", "rejection"))
    flag(p, "lookup-only", help="no drafter node: the gateway speculates only with blocks prompt lookup supplies, "
         "copied from the sequence itself (shows what the drafter node adds)", cast=bool)
    flag(p, "no-speculation", help="every request decodes with the target alone (the gateway's --no-speculation): "
         "on one small box serving several clients at once, speculation can cost the shared forward more than it "
         "saves (README, Several clients at once)", cast=bool)
    flag(p, "no-draft-ahead", help="the gateway asks the drafter for each block when the round needs it instead "
         "of having it draft the next block while the verifier checks this one (a model drafter already drafts "
         "only when asked unless --drafter-cpus and --verifier-cpus are disjoint: on shared cores drafting ahead "
         "would slow the forward it overlaps)", cast=bool)
    flag(p, "drafter-threads", 1, int, help="ONNX Runtime threads of the drafter")
    flag(p, "verifier-threads", 0, int, help="torch threads of the verifier (0: torch's default)")
    flag(p, "activations", "auto", help="the verifier's arithmetic on a GGUF file's blocks: 'fp32' (agrees with "
         "transformers to fp32 rounding), 'int8' (llama.cpp's: activations rounded to int8, faster) or 'auto' (int8 "
         "where most of the layers are 5-bit or K-quant blocks, which fp32 rebuilds slowly; else fp32); speculative "
         "output equals plain decoding either way (see tandem serve-verifier --help)")
    flag(p, "separate-verifier", help="run the verifier as a service of its own, reached over gRPC as on two "
         "machines, instead of in the gateway's process (the default: no gRPC hop between them, less CPU a token; "
         "AMD EPYC, 2 CPUs: plain decoding +17 %% for one client, +24 %% for four, BENCHMARKS.md)", cast=bool)
    flag(p, "verifier-cpus", None, help="pin the verifier and the gateway to these CPUs, e.g. '0' (Linux; "
         "unset: all)")
    flag(p, "drafter-cpus", None, help="pin the drafter to these CPUs, e.g. '1': with --verifier-cpus, drafting "
         "never competes with verification for cores, as on two machines")
    flag(p, "startup-timeout", 900.0, float, help="seconds to wait for every child to be healthy")
    flag(p, "log-dir", None, help=f"write each service's log here (default: a new {LOG_PREFIX}* folder in the "
         f"temporary directory; the {KEEP_LOG_DIRS} latest of those are kept, none older than a day)")
    flag(p, "metrics-port", None, int, help="Prometheus metrics: gateway on this port, verifier on +1, drafter on "
         "+2 (unset: off); the verifier's come from the gateway's process unless --separate-verifier")
    flag(p, "allowed-origins", "", help="web origins whose pages may call the HTTP API from a browser (the "
         "gateway's --allowed-origins)")
    flag(p, "allowed-hosts", "", help="names the HTTP API answers to besides IP addresses, localhost and this "
         "machine's name (the gateway's --allowed-hosts)")


def configure_demo(p):
    configure(p)
    p.add_argument("prompt", nargs="?", default="Write a haiku about autumn.", help="the prompt to generate from")
    flag(p, "max-tokens", 64, int, help="new tokens to generate")


# ---- ports ---------------------------------------------------------------------------------------
def port_in_use(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether a server could not listen on host:port now (bound as gRPC binds: SO_REUSEADDR, no SO_REUSEPORT)."""
    if not port:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_ports(args) -> None:
    """Raises PortInUse for the first port of --gateway-port / --metrics-port (+1, +2) already taken."""
    port = getattr(args, "gateway_port", 0)
    if port_in_use(port):
        raise PortInUse(f"port {port} is in use (another `tandem up`?); pick another with --gateway-port")
    http = getattr(args, "http_port", -1)
    if http is not None and http > 0 and port_in_use(http):
        raise PortInUse(f"port {http} (the gateway's HTTP API) is in use; pick another with --http-port, or -1 "
                        "for none")
    base = getattr(args, "metrics_port", None)
    if base:
        for offset, name in enumerate(("gateway", "verifier", "drafter")):
            if port_in_use(base + offset):
                raise PortInUse(f"port {base + offset} (the {name}'s metrics, --metrics-port + {offset}) is in use; "
                                "pick another with --metrics-port")


# ---- start ---------------------------------------------------------------------------------------
def _label(kind: str, spec: str | None) -> str:
    if spec in (None, "", "default"):
        if kind == "verifier":
            from tandem.models import DEFAULT_MODEL_NAME

            return f"verifier ({DEFAULT_MODEL_NAME})"
        with contextlib.suppress(ImportError, AttributeError, OSError):
            from tandem.defaults import SHIPPED_DRAFTER

            if (SHIPPED_DRAFTER / "model.onnx").exists():
                return f"drafter ({SHIPPED_DRAFTER.name})"
        return "drafter (default)"
    return f"{kind} ({Path(str(spec)).name or spec})"


def drafter_computes(drafter: str | None, lookup_only: bool) -> bool:
    """Whether the drafter node runs a model (every node but the model-free suffix one, ``--drafter suffix``).
    A model drafter on the verifier's cores slows the forward while it drafts ahead, so ``up`` tells the gateway
    so (``--drafter-shares-cpus``); suffix drafting is a table lookup, and its blocks drafted ahead are what
    makes repeated traffic fast (BENCHMARKS.md, fifteenth session)."""
    from drafter_service.factory import MODEL_FREE_KINDS

    return not lookup_only and str(drafter or "default") not in MODEL_FREE_KINDS


def start_cluster(args) -> Cluster:
    """Starts the drafter and the gateway (with the target, or a separate verifier) and waits until all are
    healthy. Raises ValueError on bad CPU lists and PortInUse (a ValueError) on a port in use before starting
    any; PortInUse, StartupFailed or TimeoutError if one cannot start (the others are stopped then)."""
    v_cpus = getattr(args, "verifier_cpus", None)
    d_cpus = getattr(args, "drafter_cpus", None)
    for name, spec in (("verifier", v_cpus), ("drafter", d_cpus)):
        if spec:
            try:
                check_cpus(spec)
            except (ValueError, RuntimeError) as exc:
                raise ValueError(f"--{name}-cpus: {exc}") from None
    check_ports(args)
    if getattr(args, "http_port", -1) == 0:          # a free one, known here so it can be printed
        with socket.socket() as sock:
            sock.bind((DEFAULT_HOST, 0))
            args.http_port = sock.getsockname()[1]
    removed = []
    if args.log_dir:
        log_dir = Path(args.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        removed = clean_log_dirs()
        log_dir = Path(tempfile.mkdtemp(prefix=LOG_PREFIX))
    (log_dir / "up.pid").write_text(str(os.getpid()))
    cluster = Cluster(log_dir, gateway_port=args.gateway_port)
    write_starting(log_dir, args.gateway_port, "starting the services")
    deadline = time.monotonic() + args.startup_timeout
    local = not getattr(args, "separate_verifier", False)      # the target in the gateway's process
    note(f"logs: {log_dir}/{{{'' if local else 'verifier,'}drafter,gateway}}.log"
         + (f" (removed {len(removed)} old {LOG_PREFIX}* log folder{'s' * (len(removed) != 1)})" if removed else ""))
    note(f"starting {_label('verifier', args.target)}" + ("" if getattr(args, "lookup_only", False)
                                                          else f" and {_label('drafter', args.drafter)}"))
    base = getattr(args, "metrics_port", None)
    metrics = (lambda n: ["--metrics-port", str(base + n)]) if base else (lambda n: [])
    pin = (lambda cpus: ["--cpus", str(cpus)] if cpus else [])
    try:
        activations = getattr(args, "activations", None)         # None: the verifier's own default (its env)
        target = ["--target", args.target, "--threads", str(args.verifier_threads),
                  *(["--activations", activations] if activations else [])]
        if not local:
            cluster.spawn("verifier", [*target, *pin(v_cpus), *metrics(1)], label=_label("verifier", args.target))
        lookup_only = getattr(args, "lookup_only", False)
        if not lookup_only:
            cluster.spawn("drafter", ["--drafter", args.drafter, "--threads", str(args.drafter_threads),
                                      *pin(d_cpus), *metrics(2)], label=_label("drafter", args.drafter))
        cluster.wait_up(([] if local else ["verifier"]) + ([] if lookup_only else ["drafter"]), deadline)
        verifier, drafter = cluster.ports.get("verifier"), cluster.ports.get("drafter")
        cluster.spawn("gateway", [*(["--verifier", "local", *target] if local
                                    else ["--verifier", f"{DEFAULT_HOST}:{verifier}"]),
                                  *(["--lookup-only", "--drafter", ""] if lookup_only
                                    else ["--drafter", f"{DEFAULT_HOST}:{drafter}"]),
                                  *(["--no-draft-ahead"] if getattr(args, "no_draft_ahead", False) else []),
                                  *(["--no-speculation"] if getattr(args, "no_speculation", False) else []),
                                  *(["--drafter-shares-cpus"] if drafter_computes(args.drafter, lookup_only)
                                    and cores_shared(v_cpus, d_cpus) else []),
                                  "--draft-length", str(args.draft_length or "auto"),
                                  *(["--max-draft-length", str(args.max_draft_length)]
                                    if getattr(args, "max_draft_length", None) else []),
                                  "--http-port", str(getattr(args, "http_port", -1)),
                                  "--unseeded-sampling", getattr(args, "unseeded_sampling", "coupled"),
                                  "--draft-confidence", str(args.draft_confidence), *pin(v_cpus), *metrics(0),
                                  *[arg for name in ("allowed_origins", "allowed_hosts") if getattr(args, name, "")
                                    for arg in (f"--{name.replace('_', '-')}", getattr(args, name))]],
                      port=args.gateway_port, label="gateway" + (f" with {_label('verifier', args.target)}"
                                                                 if local else ""))
        cluster.wait_up(["gateway"], deadline)
        gateway = cluster.ports["gateway"]
    except BaseException:
        cluster.stop()
        raise
    finally:
        with contextlib.suppress(OSError):
            (log_dir / STATE_FILE).unlink()
    note(f"up: gateway {DEFAULT_HOST}:{gateway}  verifier "
         + ("in the gateway's process  " if local else f"{DEFAULT_HOST}:{verifier}  ")
         + (f"drafter {DEFAULT_HOST}:{drafter}" if drafter else "no drafter (--lookup-only)"))
    return cluster


def _start_or_explain(args, command: str) -> Cluster | int:
    """The started cluster, or the exit code after saying why not (2: bad flags or a port in use, 1: a child
    failed to start)."""
    try:
        return start_cluster(args)
    except ValueError as exc:
        print(f"tandem {command}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except (StartupFailed, TimeoutError) as exc:
        print(f"tandem {command}: error: {exc}", file=sys.stderr, flush=True)
        return 1


def _tandem_command() -> str:
    """How the user can run ``tandem`` from here: bare when it is on PATH, else the venv's path."""
    import shutil

    exe = Path(sys.executable).with_name("tandem")
    found = shutil.which("tandem")
    return "tandem" if found and Path(found).resolve() == exe.resolve() else str(exe) if exe.exists() else "tandem"


def run(args) -> int:
    with stop_on_signals():
        cluster = None
        try:
            cluster = _start_or_explain(args, "up")
            if isinstance(cluster, int):
                return cluster
            tandem = _tandem_command()
            note(f'try: {tandem} generate --gateway {DEFAULT_HOST}:{cluster.ports["gateway"]} --chat '
                 '"Write a haiku about autumn."   (Ctrl-C stops them all)')
            if getattr(args, "http_port", -1) >= 0:
                note(f"chat page and OpenAI-compatible API: http://{DEFAULT_HOST}:{args.http_port}/  "
                     f"(base_url http://{DEFAULT_HOST}:{args.http_port}/v1)")
            return cluster.supervise()
        except Stop as stop:
            note(f"{stop}: stopping them all" if isinstance(cluster, Cluster) else f"{stop}: stopped while starting")
            return 0
        finally:
            if isinstance(cluster, Cluster):
                cluster.stop()
                note(f"stopped; logs kept in {cluster.log_dir}")


def run_demo(args) -> int:
    from types import SimpleNamespace

    from tandem.generate import generate_command

    with stop_on_signals():
        cluster = None
        try:
            cluster = _start_or_explain(args, "demo")
            if isinstance(cluster, int):
                return cluster
            gen = SimpleNamespace(prompt=args.prompt, gateway=f"{DEFAULT_HOST}:{cluster.ports['gateway']}",
                                  max_tokens=args.max_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=None,
                                  draft_length=0, no_speculation=False, chat=True, ignore_eos=False, stream=False,
                                  json=False, trace=True, timeout=600.0)
            note(f"generating (greedy, chat template, {args.max_tokens} tokens max): {args.prompt!r}\n")
            return generate_command(gen)
        except Stop:
            return 130
        finally:
            if isinstance(cluster, Cluster):
                cluster.stop()
