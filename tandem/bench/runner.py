"""Running the benchmark: services, warm-up, the plan under a time budget, the timed requests.

Every request becomes one *sample* (a plain dict, stored as is in the JSON): the client-side
timings (wall time from sending the request to the last streamed chunk, time to the first token),
the tokens, and for gateway modes the gateway's own statistics and round-by-round figures.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

from tandem.bench import modes as M
from tandem.bench.memory import RssMonitor, scrape_peak_rss, self_peak_rss_bytes
from tandem.bench.workload import Prompt

ROUND_FIELDS = ("k", "proposed", "accepted", "rejection_position", "bonus", "draft_ms", "verify_ms", "overhead_ms",
                "round_ms")
# the automatic draft length's figures (gateway/draft_length.py); read when the gateway's RoundStats has them
AUTO_ROUND_FIELDS = ("k_reason", "expected_tokens", "expected_tokens_per_ms", "lookup_tokens", "emitted",
                     "source")   # source: where the block came from (copy, ahead, wait, propose; "" plain)
SERVER_FIELDS = ("prompt_tokens", "new_tokens", "rounds", "proposed", "accepted", "mean_acceptance_length",
                 "acceptance_rate", "ttft_ms", "total_ms", "draft_ms", "verify_ms", "overhead_ms", "prefill_ms",
                 "tokens_per_second", "speculative", "fallback_reason", "draft_model", "target_model")


@dataclass(frozen=True)
class Settings:
    """What every mode shares: the same for baseline, speculative and HF requests."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    timeout_s: float = 600.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def seed_for(self, prompt: Prompt) -> int | None:
        """Sampled runs: one fixed seed per prompt (the same in every repeat and mode)."""
        return None if self.greedy else self.seed + prompt.question_id


def _base_sample(mode: M.Mode, prompt: Prompt, repeat: int) -> dict:
    return {"mode": mode.name, "question_id": prompt.question_id, "category": prompt.category, "repeat": repeat}


# ---- Tandem through the gateway -------------------------------------------------------------------
class GatewayRunner:
    def __init__(self, address: str):
        import grpc

        from tandem.pb import gateway_grpc, gateway_pb2
        from tandem.serving import CHANNEL_OPTIONS

        self.address = address
        self.pb = gateway_pb2
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = gateway_grpc.GatewayStub(self.channel)
        self.adaptive_field = M.adaptive_field(gateway_pb2.GenerateRequest)
        names = set(gateway_pb2.RoundStats.DESCRIPTOR.fields_by_name)
        self.round_fields = ROUND_FIELDS + tuple(f for f in AUTO_ROUND_FIELDS if f in names)
        self.has_auto = "k_reason" in names

    def close(self) -> None:
        self.channel.close()

    def request(self, mode: M.Mode, prompt: Prompt, settings: Settings, max_tokens: int | None = None):
        from tandem.pb import common_pb2

        seed = settings.seed_for(prompt)
        sampling = common_pb2.SamplingParams(temperature=settings.temperature, top_k=settings.top_k,
                                             top_p=settings.top_p, seed=seed or 0, has_seed=seed is not None)
        req = self.pb.GenerateRequest(prompt=prompt.text, chat=True, max_tokens=max_tokens or settings.max_tokens,
                                      sampling=sampling, ignore_eos=settings.ignore_eos,
                                      no_speculation=not mode.speculative, draft_length=mode.k)
        if mode.adaptive:
            if not self.adaptive_field:
                raise RuntimeError("this gateway has no adaptive draft length")
            setattr(req, self.adaptive_field, mode.confidence)
        elif mode.speculative and self.adaptive_field:
            setattr(req, self.adaptive_field, 0.0)  # a fixed k drafts exactly k tokens; auto: its k exactly
        return req

    def run(self, mode: M.Mode, prompt: Prompt, settings: Settings, repeat: int = 0,
            max_tokens: int | None = None) -> dict:
        import grpc

        sample = _base_sample(mode, prompt, repeat)
        req = self.request(mode, prompt, settings, max_tokens)
        token_ids: list[int] = []
        text: list[str] = []
        chunk_ms: list[float] = []          # arrival of each chunk with tokens (ms from the send) ...
        chunk_tokens: list[int] = []        # ... and its token count: decode speed and inter-token latency
        ttft = None
        stats = None
        finish = ""
        t0 = time.perf_counter()
        try:
            for chunk in self.stub.GenerateStream(req, timeout=settings.timeout_s):
                if chunk.token_ids:
                    chunk_ms.append((time.perf_counter() - t0) * 1e3)
                    chunk_tokens.append(len(chunk.token_ids))
                    if ttft is None:
                        ttft = chunk_ms[-1] / 1e3
                token_ids.extend(chunk.token_ids)
                text.append(chunk.text)
                if chunk.HasField("stats"):
                    stats = chunk.stats
                    finish = chunk.finish_reason
        except grpc.RpcError as err:
            sample["error"] = f"{err.code().name}: {err.details()}"
            return sample
        wall = time.perf_counter() - t0
        sample.update(wall_ms=wall * 1e3, ttft_ms=(ttft or wall) * 1e3, new_tokens=len(token_ids),
                      tokens_per_s=len(token_ids) / wall if wall > 0 else 0.0, finish_reason=finish,
                      token_ids=token_ids, text="".join(text), chunk_ms=chunk_ms, chunk_tokens=chunk_tokens)
        if stats is not None:
            sample["prompt_tokens"] = stats.prompt_tokens
            sample["server"] = {f: getattr(stats, f) for f in SERVER_FIELDS}
            sample["server"]["accepted_per_position"] = list(stats.accepted_per_position)
            sample["server"]["proposed_per_position"] = list(stats.proposed_per_position)
            sample["rounds"] = {f: [getattr(r, f) for r in stats.round_stats] for f in self.round_fields}
            if mode.speculative and (not stats.speculative or stats.fallback_reason):
                # the gateway decoded (part of) this request without the drafter: flagged, never hidden
                sample["fallback"] = stats.fallback_reason or "the gateway decoded without the drafter"
        return sample


def fetch_info(verifier_addr: str | None, drafter_addr: str | None) -> dict:
    """Model information from the verifier and drafter (GetInfo), for the report. Never raises."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from tandem.pb import common_pb2, drafter_grpc, verifier_grpc
    from tandem.serving import CHANNEL_OPTIONS

    out: dict = {}
    for name, addr, stub_cls in (("target", verifier_addr, verifier_grpc.VerifierStub),
                                 ("drafter", drafter_addr, drafter_grpc.DrafterStub)):
        if not addr:
            continue
        try:
            with grpc.insecure_channel(addr, options=CHANNEL_OPTIONS) as ch:
                msg = stub_cls(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=30)
            info = MessageToDict(msg.model if name == "target" else msg, preserving_proto_field_name=True)
            info["address"] = addr
            out[name] = info
        except grpc.RpcError as err:
            out[name] = {"address": addr, "error": f"{err.code().name}: {err.details()}"}
    return out


# ---- in-process Hugging Face transformers -----------------------------------------------------------
class HFRunner:
    """``model.generate`` of the target alone and with ``assistant_model=`` the torch drafter, in this
    process (no network): the peer baseline. Target forwards are counted with a forward hook, so
    its mean acceptance length is new tokens / target forwards (the prefill is merged into the first
    verification in HF's assisted generation)."""

    def __init__(self, target_spec: str, drafter_spec: str | None, eos_token_ids: list[int] | None,
                 assistant_tokens: int = 0, threads: int = 0):
        import torch

        if threads:
            torch.set_num_threads(threads)      # the verifier's thread count: a like-for-like peer
        from transformers.utils import logging as hf_logging

        from tandem.models import load_causal_lm

        hf_logging.set_verbosity_error()   # assisted generation warns about its own internal generate() call
        self.torch = torch
        self.model, self.tokenizer, self.target_loc = load_causal_lm(target_spec)
        self.draft_vocab_size = None
        self.assistant = None
        self.assistant_loc = None
        if drafter_spec:
            from tandem.models import resolve

            d = resolve(drafter_spec)
            if (d.directory.resolve(), d.gguf_file) == (self.target_loc.directory.resolve(), self.target_loc.gguf_file):
                # the drafter is the target itself (the self-drafter): copy it rather than load it twice
                self.assistant, self.assistant_loc = copy.deepcopy(self.model), self.target_loc
            else:
                self.assistant, _, self.assistant_loc = load_causal_lm(drafter_spec)
                self.draft_vocab_size = restrict_to_draft_vocab(self.assistant, self.assistant_loc.directory)
            if assistant_tokens:
                gc = self.assistant.generation_config
                gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = assistant_tokens, "constant"
                gc.assistant_confidence_threshold = 0.0
            self._assistant_config = copy.deepcopy(self.assistant.generation_config)
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids else None
        self.assistant_tokens = assistant_tokens
        self.forwards = 0
        self.model.register_forward_hook(self._count)
        self._ids_cache: dict[int, list[int]] = {}

    def _count(self, *_):
        self.forwards += 1

    def config(self) -> dict:
        gc = self.assistant.generation_config if self.assistant is not None else None
        return {"torch_threads": self.torch.get_num_threads(), "assistant_draft_vocab": self.draft_vocab_size,
                "target": str(self.target_loc.directory / (self.target_loc.gguf_file or "")),
                "assistant": str(self.assistant_loc.directory / (self.assistant_loc.gguf_file or ""))
                if self.assistant_loc else None,
                "num_assistant_tokens": getattr(gc, "num_assistant_tokens", None) if gc else None,
                "num_assistant_tokens_schedule": getattr(gc, "num_assistant_tokens_schedule", None) if gc else None,
                "assistant_confidence_threshold": getattr(gc, "assistant_confidence_threshold", None) if gc else None,
                "setting": "HF's defaults (transformers 5: num_assistant_tokens 20, constant schedule, the assistant "
                "stops drafting early below confidence 0.4)" if not self.assistant_tokens else
                f"--hf-k {self.assistant_tokens}: num_assistant_tokens {self.assistant_tokens}, constant, no early stop"}

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The chat template applied exactly as the gateway does it (text, then tokens, no specials)."""
        if prompt.question_id not in self._ids_cache:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                                      add_generation_prompt=True, tokenize=False)
            self._ids_cache[prompt.question_id] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._ids_cache[prompt.question_id]

    def run(self, mode: M.Mode, prompt: Prompt, settings: Settings, repeat: int = 0,
            max_tokens: int | None = None) -> dict:
        from transformers.generation.streamers import BaseStreamer

        torch = self.torch
        sample = _base_sample(mode, prompt, repeat)
        ids = self.prompt_ids(prompt)

        class FirstToken(BaseStreamer):
            calls, first = 0, None

            def put(self, value):
                self.calls += 1
                if self.calls == 2 and self.first is None:        # the first put is the prompt
                    self.first = time.perf_counter()

            def end(self):
                pass

        gen = copy.deepcopy(self.model.generation_config)
        gen.max_new_tokens = max_tokens or settings.max_tokens
        gen.min_new_tokens = None
        gen.eos_token_id = [] if settings.ignore_eos else self.eos_token_ids or gen.eos_token_id  # None: model's
        gen.pad_token_id = gen.pad_token_id if gen.pad_token_id is not None else (self.eos_token_ids or [0])[0]
        if settings.greedy:
            gen.do_sample, gen.temperature, gen.top_k, gen.top_p = False, None, None, None
        else:
            gen.do_sample, gen.temperature = True, settings.temperature
            gen.top_k, gen.top_p = settings.top_k or None, settings.top_p
            torch.manual_seed(settings.seed_for(prompt))
        kwargs = {}
        if mode.name == M.HF_ASSISTED:
            self.assistant.generation_config = copy.deepcopy(self._assistant_config)  # HF adapts it per call
            kwargs["assistant_model"] = self.assistant
        streamer = FirstToken()
        input_ids = torch.tensor([ids])
        self.forwards = 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen,
                                      streamer=streamer, **kwargs)
        wall = time.perf_counter() - t0
        new = out[0, len(ids):].tolist()
        eos = set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id])
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))   # drop padding after EOS, if any
        new = new[:cut]
        sample.update(wall_ms=wall * 1e3, ttft_ms=((streamer.first or t0 + wall) - t0) * 1e3, new_tokens=len(new),
                      tokens_per_s=len(new) / wall if wall > 0 else 0.0, prompt_tokens=len(ids),
                      finish_reason="stop" if new and new[-1] in eos else "length", token_ids=new,
                      text=self.tokenizer.decode(new, skip_special_tokens=True),
                      hf={"target_forwards": self.forwards,
                          "mean_acceptance_length": len(new) / self.forwards if self.forwards else None})
        return sample


def restrict_to_draft_vocab(model, model_dir: Path) -> int | None:
    """A distilled drafter with a reduced draft vocabulary (``tandem distill``) ships its ONNX with the
    output head sliced to those tokens; its HF weights keep the full head. Masking the other logits
    (a -1e9 bias) makes the torch drafter choose exactly as the ONNX one. Returns the draft vocabulary
    size, or None when the model uses the full vocabulary."""
    try:
        from tandem.distill.student import load_draft_vocab

        ids = load_draft_vocab(model_dir)
    except (ImportError, OSError, ValueError, KeyError):
        return None
    if ids is None:
        return None
    import torch

    head = model.get_output_embeddings()
    masked = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        masked.weight.copy_(head.weight)
        masked.bias.fill_(-1e9)
        masked.bias[torch.as_tensor(ids, dtype=torch.long)] = 0.0
    model.set_output_embeddings(masked)
    return len(ids)


# ---- the whole run ----------------------------------------------------------------------------------
def drafter_dir_no_export(spec: str | None) -> Path | None:
    """The drafter directory ``spec`` names, without ever exporting one (None if there is none yet)."""
    from tandem.defaults import SELF_DRAFTER, SHIPPED_DRAFTER

    if spec and spec != "default":
        p = Path(spec).expanduser()
        return p if p.exists() else None
    for d in (SHIPPED_DRAFTER, SELF_DRAFTER):
        if (d / "model.onnx").exists():
            return d
    return None


def drafter_metadata(drafter_dir: Path | None) -> dict | None:
    if drafter_dir is None:
        return None
    meta = drafter_dir / "drafter.json" if drafter_dir.is_dir() else drafter_dir.with_name("drafter.json")
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError):
        return {"path": str(drafter_dir)}
    data["path"] = str(drafter_dir)
    return data


def resolve_hf_drafter(choice: str, meta: dict | None) -> tuple[str | None, str]:
    """(torch drafter spec or None, a note). ``auto``: the ``source`` recorded in drafter.json."""
    if choice == "none":
        return None, "HF assisted generation not run (--hf-drafter none)"
    if choice != "auto":
        if not Path(choice).expanduser().exists():
            return None, f"HF assisted generation skipped: --hf-drafter {choice} does not exist"
        return str(Path(choice).expanduser()), f"torch drafter: {choice}"
    source = (meta or {}).get("source")
    if not source:
        return None, ("HF assisted generation skipped: the drafter's torch weights are unknown (no 'source' in "
                      "its drafter.json); pass --hf-drafter DIR")
    from tandem.pb import PACKAGE_ROOT

    # a relative source is relative to where it was exported: try the working directory, the repository
    # root and the drafter's own directory
    for base in (Path.cwd(), PACKAGE_ROOT, Path(meta.get("path", "."))):
        if (base / source).exists():
            source = str((base / source).resolve())
            break
    if not Path(source).exists():
        return None, (f"HF assisted generation skipped: the drafter's torch weights ({source}, from its "
                      "drafter.json) are not on this machine; pass --hf-drafter DIR")
    return source, f"torch drafter from drafter.json 'source': {source}"


def _timed_warmup(runner, mode: M.Mode, prompt: Prompt, settings: Settings) -> float:
    t0 = time.perf_counter()
    s = runner.run(mode, prompt, settings)
    if "error" in s:
        raise RuntimeError(f"warm-up request in mode {mode.name} failed: {s['error']}")
    return time.perf_counter() - t0


def plan_modes(prioritised: list[M.Mode], warm_s: dict[str, float], n_requests_per_mode: int,
               available_s: float | None, essential: int = 2) -> tuple[list[M.Mode], list[dict], float]:
    """Keeps modes in priority order while their projected time fits ``available_s`` (None: no limit).
    The first ``essential`` modes (groups) are always kept (the baseline and the first speculative mode;
    with auto, also the first fixed k: ``modes.essential``); the HF pair and the llama.cpp pair go
    together."""
    kept, skipped, total = [], [], 0.0
    groups: list[list[M.Mode]] = []
    pairs = {M.HF_ASSISTED: M.HF_PLAIN, M.LLAMA_LOOKUP: M.LLAMA_PLAIN}
    for m in prioritised:
        if m.name in pairs and groups and groups[-1][0].name == pairs[m.name]:
            groups[-1].append(m)
        else:
            groups.append([m])
    for i, group in enumerate(groups):
        cost = sum(warm_s.get(m.name, 0.0) for m in group) * n_requests_per_mode
        essential_group = i < essential
        if essential_group or available_s is None or total + cost <= available_s:
            kept.extend(group)
            total += cost
        else:
            for m in group:
                skipped.append({"mode": m.name, "reason": f"projected {cost / 60:.1f} min, but only "
                                f"{max(0.0, available_s - total) / 60:.1f} min of the time budget are left after the "
                                "modes before it; rerun with --time-budget 0 or a larger one"})
    return kept, skipped, total


def pick_warmup_prompt(prompts: list[Prompt]) -> Prompt:
    """The prompt whose length is closest to the mean: its warm-up times project the run's cost."""
    mean = sum(len(p.text) for p in prompts) / len(prompts)
    return min(prompts, key=lambda p: abs(len(p.text) - mean))


def start_services(args, log_dir: Path, http_port: int = -1):
    """The three services as ``tandem up`` starts them (``http_port`` 0: the OpenAI HTTP API on a free
    port, then in ``cluster``'s args; -1: none)."""
    from tandem.up import start_cluster

    # the gateway's default draft length must be auto: a request's draft_length 0 means "the gateway's
    # default", so only a gateway started with auto runs the auto mode (fixed-k modes pin their own k)
    ns = SimpleNamespace(target=args.target, drafter=args.drafter, gateway_port=0, draft_length=0,
                         max_draft_length=getattr(args, "max_draft_length", 8), draft_confidence=0.0,
                         drafter_threads=args.drafter_threads, verifier_threads=args.verifier_threads,
                         verifier_cpus=getattr(args, "verifier_cpus", None),
                         drafter_cpus=getattr(args, "drafter_cpus", None), startup_timeout=args.startup_timeout,
                         log_dir=str(log_dir), http_port=http_port)
    cluster = start_cluster(ns)
    cluster.http_port = ns.http_port
    return cluster


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=not enabled, dynamic_ncols=tty,
                mininterval=0.1 if tty else 15.0)


def run_benchmark(args, prompts: list[Prompt], run_order: list[Prompt], settings: Settings, out_dir: Path,
                  t_start: float, log=print) -> dict:
    """Starts or connects to the services, warms up, plans, runs. Returns the raw results dict."""
    from tandem.bench.environment import environment, load_average

    results: dict = {"environment": environment(), "notes": []}
    notes: list[str] = results["notes"]
    cluster = None
    if args.gateway:
        gateway_addr, verifier_addr, drafter_addr = args.gateway, args.verifier_addr, args.drafter_addr
        services = {"mode": "live", "gateway": gateway_addr, "verifier": verifier_addr, "drafter": drafter_addr}
    else:
        log_dir = out_dir / "service_logs"
        t0 = time.perf_counter()
        cluster = start_services(args, log_dir)
        gateway_addr, verifier_addr, drafter_addr = (f"127.0.0.1:{cluster.ports[n]}"
                                                     for n in ("gateway", "verifier", "drafter"))
        services = {"mode": "started", "startup_s": time.perf_counter() - t0, "logs": str(log_dir),
                    "gateway": gateway_addr, "verifier": verifier_addr, "drafter": drafter_addr,
                    "verifier_threads": args.verifier_threads, "drafter_threads": args.drafter_threads,
                    "verifier_cpus": getattr(args, "verifier_cpus", None),
                    "drafter_cpus": getattr(args, "drafter_cpus", None)}
        gw_cmd = [str(x) for x in (getattr(cluster.procs.get("gateway"), "args", None) or [])]
        services["gateway_command"] = gw_cmd
        if gw_cmd and "--max-draft-length" not in gw_cmd and args.max_draft_length != 8:
            notes.append(f"**--max-draft-length {args.max_draft_length} not applied**: tandem.up.start_cluster does "
                         "not pass it to the gateway, which keeps its default cap for auto (8)")
    results["services"] = services
    gw = None
    try:
        info = fetch_info(verifier_addr, drafter_addr)
        ddir = drafter_dir_no_export(args.drafter) if (args.drafter or not args.gateway) else None
        meta = drafter_metadata(ddir)
        results["models"] = {"target": info.get("target"), "drafter": info.get("drafter"), "drafter_files": meta,
                             "target_spec": args.target, "drafter_spec": args.drafter}
        if meta and info.get("drafter", {}).get("model_name") and meta.get("model_name") and \
                meta["model_name"] != info["drafter"]["model_name"]:
            notes.append(f"the drafter files ({meta['path']}: {meta['model_name']}) are not the model the live "
                         f"drafter serves ({info['drafter']['model_name']}): HF assisted uses the files")

        # ---- the modes --------------------------------------------------------------------------
        gw = GatewayRunner(gateway_addr)
        want_auto = not getattr(args, "no_auto", False)
        modes: list[M.Mode] = [M.BASELINE_MODE] + ([M.AUTO_MODE] if want_auto else []) + \
            [M.spec_mode(k) for k in args.k_sweep]
        if not want_auto:
            notes.append("auto mode: not run (--no-auto)")
        if gw.adaptive_field and args.adaptive_k:
            modes.append(M.adaptive_mode(args.adaptive_k, args.draft_confidence))
        elif not args.adaptive_k:
            notes.append("adaptive mode: not run (--adaptive-k 0)")
        else:
            notes.append("adaptive mode: not run, this gateway has no adaptive draft length yet "
                         f"(GenerateRequest has none of the fields {', '.join(M.ADAPTIVE_FIELDS)})")
        hf_spec, hf_note = (None, "HF modes not run (--no-hf)") if args.no_hf else \
            resolve_hf_drafter(args.hf_drafter, meta)
        hf_plain = not args.no_hf           # HF generate of the target alone needs no drafter
        if hf_plain:
            target_name = (info.get("target") or {}).get("model_name")
            try:
                from tandem.models import resolve

                hf_target_name = resolve(args.target).name
            except FileNotFoundError as exc:
                hf_spec, hf_plain, hf_note = None, False, f"HF modes skipped: {exc}"
            else:
                if target_name and hf_target_name != target_name:
                    hf_spec, hf_plain = None, False
                    hf_note = (f"HF modes skipped: --target {args.target} ({hf_target_name}) is not the verifier's "
                               f"target ({target_name}); pass the verifier's --target")
        hf_modes = ([M.HF_PLAIN_MODE] if hf_plain else []) + ([M.HF_ASSISTED_MODE] if hf_spec else [])
        llama_gguf, llama_note = _llama_plan(args, info)

        # ---- warm-up: priming, then one untimed request per mode on a mean-length prompt ----------
        # Priming (a few tokens, plain and speculative) takes the first-call costs of every process,
        # so that the per-mode warm-up times are steady-state and fit to project the run's cost.
        warm_prompt = pick_warmup_prompt(prompts)
        n_per_mode = len(run_order) * args.repeats
        budget = lambda: None if not args.time_budget else (
            args.time_budget * 60 - (time.perf_counter() - t_start) - args.report_margin)
        warm_s: dict[str, float] = {}
        prime = min(4, settings.max_tokens)
        bar = _progress(len(modes) + 2, "warm-up", args.progress)
        gw.run(M.BASELINE_MODE, warm_prompt, settings, max_tokens=prime)
        gw.run(M.spec_mode(args.default_k if args.default_k in args.k_sweep else args.k_sweep[0]), warm_prompt,
               settings, max_tokens=prime)
        bar.update(2)
        for m in list(modes):
            bar.set_postfix_str(m.name)
            if m.auto:
                t0 = time.perf_counter()
                s = gw.run(m, warm_prompt, settings)
                if "error" in s:
                    raise RuntimeError(f"warm-up request in mode {m.name} failed: {s['error']}")
                why = auto_unavailable(s)
                if why:
                    modes.remove(m)
                    notes.append(f"**auto mode: not run**: {why}")
                    log(f"[bench] auto mode not run: {why}")
                else:
                    warm_s[m.name] = time.perf_counter() - t0
            else:
                warm_s[m.name] = _timed_warmup(gw, m, warm_prompt, settings)
            bar.update()
        bar.close()

        # The HF pair needs two more models in this process: load them only if the pair can fit, judged
        # first from the gateway's baseline and default-k warm-ups, then from its own warm-ups.
        hf = None
        if hf_modes:
            k0 = next((m.name for m in M.priority(modes, args.default_k) if M.is_fixed_k(m)), M.BASELINE)
            guess = dict(warm_s, **{M.HF_PLAIN: warm_s[M.BASELINE], M.HF_ASSISTED: warm_s[k0]})
            prio = M.priority(modes + hf_modes, args.default_k)
            kept, _, _ = plan_modes(prio, guess, n_per_mode, budget(), essential=M.essential(prio))
            if not {m.name for m in hf_modes} & {m.name for m in kept}:
                hf_note = ("HF modes skipped without loading: their projected time (estimated from the baseline's "
                           f"and {k0}'s warm-ups) does not fit the time budget; rerun with --time-budget 0")
            else:
                log(f"[bench] loading the target in-process for HF generate (torch drafter: {hf_spec or 'none'})")
                eos = (info.get("target") or {}).get("eos_token_ids")
                hf = HFRunner(args.target, hf_spec, [int(e) for e in eos] if eos else None, args.hf_k,
                              threads=args.verifier_threads)
                for m in hf_modes:
                    hf.run(m, warm_prompt, settings, max_tokens=prime)
                    warm_s[m.name] = _timed_warmup(hf, m, warm_prompt, settings)
                modes += hf_modes
                hf_note = f"HF modes: {hf_note}"
        notes.append(hf_note)
        results["hf"] = hf.config() if hf else None

        # llama.cpp on the target's GGUF: cheap to load (mmapped), so loaded, warmed up, then planned
        llama = None
        if llama_gguf is not None:
            try:
                llama = _load_llama(args, llama_gguf, hf, info, prompts, settings)
                for m in (M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE):
                    llama.run(m, warm_prompt, settings, max_tokens=prime)
                    warm_s[m.name] = _timed_warmup(llama, m, warm_prompt, settings)
                modes += [M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE]
                llama_note = (f"llama.cpp peers: llama-cpp-python {llama.config()['llama_cpp_python']} on "
                              f"{llama_gguf.name}, {llama.threads} threads, prompt lookup of up to "
                              f"{llama.lookup_tokens} tokens (n-grams <= {llama.lookup_ngram})")
            except Exception as exc:  # noqa: BLE001 - a broken optional peer must not lose the run
                llama = None
                llama_note = f"llama.cpp peers skipped: {type(exc).__name__}: {exc}"
        if llama_note:
            notes.append(llama_note)
            if llama is None:
                log(f"[bench] {llama_note}")
        results["llama"] = llama.config() if llama else {"skipped": llama_note}
        runners = {"gateway": gw, "hf": hf, "llama": llama}

        # the memory-bandwidth floor: weights bytes / read bandwidth measured now (again after the timed phase)
        from tandem.bench.environment import read_bandwidth_gbs, target_weights

        results["floor"] = {"weights": target_weights(args.target),
                            "bandwidth_before": read_bandwidth_gbs(args.verifier_threads)}

        # ---- plan ---------------------------------------------------------------------------------
        elapsed = time.perf_counter() - t_start
        prio = M.priority(modes, args.default_k)
        kept, skipped, projected = plan_modes(prio, warm_s, n_per_mode, budget(), essential=M.essential(prio))
        run_modes = [m for m in modes if m in kept]          # run in the user's order, not priority
        results["plan"] = {"modes": [asdict(m) for m in run_modes], "skipped": skipped,
                           "warmup_prompt": warm_prompt.question_id, "warmup_s": warm_s,
                           "projected_timed_s": projected, "budget_s": args.time_budget * 60 or None,
                           "elapsed_before_timed_s": elapsed, "requests": n_per_mode * len(run_modes)}
        for sk in skipped:
            log(f"[bench] SKIPPED {sk['mode']}: {sk['reason']}")
        log(f"[bench] timed phase: {len(run_modes)} modes x {len(run_order)} prompts x {args.repeats} repeats "
            f"= {n_per_mode * len(run_modes)} requests, projected {projected / 60:.1f} min")

        # ---- timed phase --------------------------------------------------------------------------
        samples: list[dict] = []
        pids = {n: p.pid for n, p in cluster.procs.items()} if cluster else dict(args.pids or {})
        results["load_average_before_timed"] = load_average()
        t_timed = time.perf_counter()
        with RssMonitor(pids) as rss:
            bar = _progress(n_per_mode * len(run_modes), "bench", args.progress)
            try:
                for repeat in range(args.repeats):
                    for prompt in run_order:
                        for m in run_modes:
                            bar.set_postfix_str(f"r{repeat + 1} {prompt.category} q{prompt.question_id} {m.name}")
                            s = runners[m.kind].run(m, prompt, settings, repeat)
                            if "error" in s:
                                log(f"[bench] ERROR {m.name} q{prompt.question_id} repeat {repeat}: {s['error']}")
                            samples.append(s)
                            bar.update()
            except KeyboardInterrupt:
                # keep what was measured: the report covers the prompts done in every mode
                results["interrupted"] = f"interrupted after {len(samples)} of {n_per_mode * len(run_modes)} requests"
                notes.append(f"**{results['interrupted']}** (Ctrl-C): the figures cover only the requests done")
                log(f"[bench] {results['interrupted']}; writing the report of what was measured")
            bar.close()
        results["timed_s"] = time.perf_counter() - t_timed
        results["load_average_after_timed"] = load_average()
        results["floor"]["bandwidth_after"] = read_bandwidth_gbs(args.verifier_threads)
        memory = rss.report()
        for name, url in (args.metrics or {}).items():
            if name not in memory:
                memory[name] = scrape_peak_rss(url)
        for name in ("verifier", "drafter", "gateway"):
            memory.setdefault(name, {"source": "n/a", "note": "live service: give --pids or --metrics to measure"})
        if hf is not None or llama is not None:
            what = " and ".join(n for n, r in (("HF", hf), ("llama.cpp", llama)) if r is not None)
            memory[f"bench process ({what} in-process)"] = {"source": "process", "peak_rss_bytes": self_peak_rss_bytes()}
        results["memory"] = memory
        results["samples"] = samples
        results["modes"] = [asdict(m) for m in run_modes]
        return results
    finally:
        if gw is not None:
            gw.close()
        if cluster is not None:
            cluster.stop()


def auto_unavailable(sample: dict) -> str | None:
    """Why a warm-up request of the auto mode did not run the automatic draft length, or None. A request's
    draft_length 0 means "the gateway's default": a gateway started with ``--draft-length N`` pins N."""
    rounds = sample.get("rounds") or {}
    reasons = [r for r in rounds.get("k_reason", []) if r]
    if "k_reason" not in rounds:
        return ("this gateway reports no k_reason per round (it predates the automatic draft length, "
                "GenerateRequest.draft_length 0 = auto)")
    if reasons and all(r == "pinned" for r in reasons):
        return ("the gateway's default draft length is pinned (started with --draft-length N), so draft_length 0 "
                "is not auto there; start it with --draft-length auto")
    return None


def _llama_plan(args, info: dict) -> tuple[Path | None, str]:
    """(the GGUF for the llama.cpp peers, or None; a note: why not, '' when they run)."""
    from tandem.bench import llama_peer

    if getattr(args, "no_llama", False):
        return None, "llama.cpp peers not run (--no-llama)"
    ok, why = llama_peer.available()
    if not ok:
        return None, why
    gguf, why = llama_peer.gguf_path(args.target)
    if gguf is None:
        return None, why
    target_name = (info.get("target") or {}).get("model_name")
    from tandem.models import resolve

    if target_name and resolve(args.target).name != target_name:
        return None, (f"llama.cpp peers skipped: --target {args.target} ({resolve(args.target).name}) is not the "
                      f"verifier's target ({target_name}); pass the verifier's --target")
    return gguf, ""


def _load_llama(args, gguf: Path, hf, info: dict, prompts: list[Prompt], settings: Settings):
    from tandem.bench.llama_peer import LlamaCppRunner, chat_prompt_ids

    if hf is not None:
        tokenizer = hf.tokenizer
    else:
        from tandem.models import load_tokenizer

        tokenizer = load_tokenizer(args.target)
    eos = (info.get("target") or {}).get("eos_token_ids")
    ids = {p.question_id: chat_prompt_ids(tokenizer, p.text) for p in prompts}
    longest = max(len(x) for x in ids.values())
    n_ctx = max(256, -(-(longest + settings.max_tokens + 16) // 256) * 256)   # with lookup, n_ctx x vocab floats
    runner = LlamaCppRunner(gguf, tokenizer, [int(e) for e in eos] if eos else None, args.verifier_threads, n_ctx,
                            lookup_tokens=getattr(args, "llama_lookup_tokens", 10),
                            lookup_ngram=getattr(args, "llama_lookup_ngram", 2))
    runner._ids_cache.update(ids)
    return runner


def default_out_dir(root: Path | None = None) -> Path:
    from tandem.pb import PACKAGE_ROOT

    base = root or (PACKAGE_ROOT / "bench_out" if (PACKAGE_ROOT / ".git").exists() else Path(tempfile.gettempdir()))
    return base / time.strftime("bench-%Y%m%d-%H%M%S")
