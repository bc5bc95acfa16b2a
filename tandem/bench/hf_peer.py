"""Hugging Face transformers as a peer of Tandem: ``model.generate`` of the target alone (``hf_plain``)
and with ``assistant_model=`` the torch version of the drafter (``hf_assisted``), in the bench process.

The torch drafter is found from the drafter's own files: its ``drafter.json`` records the ``source``
it was exported from (``--hf-drafter auto``), and a distilled drafter's reduced draft vocabulary is
applied to the torch model's head so that it chooses exactly as the ONNX one.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from tandem.bench import modes as M
from tandem.bench.settings import Settings, base_sample
from tandem.bench.workload import Prompt, chat_prompt_ids


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
            self._ids_cache[prompt.question_id] = chat_prompt_ids(self.tokenizer, prompt.text)
        return self._ids_cache[prompt.question_id]

    def run(self, mode: M.Mode, prompt: Prompt, settings: Settings, repeat: int = 0,
            max_tokens: int | None = None) -> dict:
        from transformers.generation.streamers import BaseStreamer

        torch = self.torch
        sample = base_sample(mode, prompt, repeat)
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
    """The drafter directory's drafter.json with its ``path`` added (only the path when it has none)."""
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
