"""The distillation training loop.

Loss at every trained position t (predicting token t+1), with the target's top-k there (from a
teacher pass) mapped into the draft vocabulary:
    hard = -log q(top-1 of the target)            (greedy agreement is what greedy speculation needs)
    soft = -sum_k p_k log q(k)                    (p = the target's top-k, renormalised)
    loss = mean over positions of (hard + soft) * weight
Answer positions have weight 1; in the prompt only a random ``prompt_fraction`` of positions is
trained (the prompt is context the drafter must read, e.g. to copy from it, but predicting it is
not the goal, and the output head is the most expensive part on long prompts).

AdamW, linear warm-up then cosine decay to 10 %, fixed seeds, checkpoints (``ckpt.pt``, atomic) every
``ckpt_every`` steps and on interruption; ``resume=True`` continues from the last checkpoint with the
same data order.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..models import model_device


CHECKPOINT_FILE = "ckpt.pt"  # in the work directory: what --resume continues


@dataclass
class TrainConfig:
    steps: int = 2000
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    max_prompt: int = 1024
    prompt_fraction: float = 0.1
    seed: int = 0
    ckpt_every: int = 100
    eval_every: int = 100
    eval_groups: int = 8
    threads: int = 1
    grad_clip: float = 1.0
    time_budget_s: float = 0.0  # > 0: this run stops after that much wall time, the cosine decay ending then


@dataclass
class Group:
    """All answers to one prompt: the prompt is encoded once per step and its KV cache shared."""

    prompt: np.ndarray  # [P]
    p_ids: np.ndarray  # [P, K] the target's top-k after each prompt position (row P-1: the first answer token)
    p_logp: np.ndarray
    answers: list  # of (tokens [A], top_ids [A-1, K], top_logp [A-1, K])

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + sum(len(a[0]) for a in self.answers)


def make_groups(shards: list[dict], max_prompt: int = 1024, max_answer: int = 512,
                answers_per_group: int = 12) -> list[Group]:
    """Groups teacher-pass records by prompt (prompts cut to their last ``max_prompt`` tokens)."""
    by: dict[bytes, Group] = {}
    current: dict[bytes, bytes] = {}
    order: list[bytes] = []
    for s in shards:
        tokens, start, ids, lp = s["tokens"], int(s["start"]), s["top_ids"], s["top_logp"]
        prompt, answer = tokens[:start], tokens[start:start + max_answer]
        if len(prompt) + len(answer) < 2 or len(answer) == 0:
            continue
        cut = max(0, len(prompt) - max_prompt)
        key = prompt.tobytes() + b"|" + str(s.get("question_id")).encode()
        g = by.get(current.get(key, b""))
        if g is None or len(g.answers) >= answers_per_group:
            ukey = key + b"#" + str(len(order)).encode()
            g = Group(prompt[cut:], ids[cut:start], lp[cut:start], [])
            by[ukey] = g
            current[key] = ukey
            order.append(ukey)
        g.answers.append((answer, ids[start:start + len(answer) - 1], lp[start:start + len(answer) - 1]))
    return [by[k] for k in order]


def batches_for_epoch(groups: list[Group], seed: int, epoch: int) -> list[int]:
    """Deterministic group order for one epoch."""
    rng = random.Random(seed * 1000003 + epoch)
    order = list(range(len(groups)))
    rng.shuffle(order)
    return order


class Trainer:
    def __init__(self, model, draft_vocab: np.ndarray, train: list[Group], val: list[Group], cfg: TrainConfig,
                 work_dir: str | os.PathLike, progress: bool = True):
        import torch

        self.torch = torch
        self.model = model
        self.cfg = cfg
        self.train_ex, self.val_ex = train, val
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.device = model_device(model)  # train where the model is (CPU or GPU)
        vocab = model.config.vocab_size
        self.draft_ids = torch.as_tensor(draft_vocab, dtype=torch.long, device=self.device)
        t2d = torch.full((vocab,), -1, dtype=torch.long, device=self.device)
        t2d[self.draft_ids] = torch.arange(len(draft_vocab), device=self.device)
        self.t2d = t2d
        # The trained head holds only the draft rows; it is written back into lm_head when saving.
        self.head = torch.nn.Parameter(model.lm_head.weight.detach()[self.draft_ids].clone())
        params = [p for n, p in model.named_parameters() if not n.startswith("lm_head") and p.requires_grad] + [self.head]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), **_fused_kw(torch))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_lambda)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.train_seconds = 0.0
        self.tokens_seen = 0
        self.history: list[dict] = []
        self.best = (-1.0, 0)  # (held-out agreement, step) of best.pt
        self._stop = False

    def _progress(self, step: int) -> float:
        """Fraction of the cosine decay done: by steps, or (with a time budget) by this run's time."""
        c = self.cfg
        prog = min(1.0, (step - c.warmup) / max(1, c.steps - c.warmup))
        if c.time_budget_s and getattr(self, "_t_run", None) is not None:
            frac = (time.perf_counter() - self._t_run) / c.time_budget_s
            prog = max(prog, min(1.0, self._p_run + (1 - self._p_run) * frac))
        return prog

    def _lr_lambda(self, step: int) -> float:
        c = self.cfg
        if step < c.warmup:
            return (step + 1) / c.warmup
        prog = self._progress(step)
        return c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    # ---------------------------------------------------------------- checkpoints
    @property
    def ckpt_path(self) -> Path:
        return self.work / CHECKPOINT_FILE

    def save_checkpoint(self) -> None:
        torch = self.torch
        state = {"model": self.model.state_dict(), "head": self.head.detach().clone(), "opt": self.opt.state_dict(),
                 "sched": self.sched.state_dict(), "step": self.step, "epoch": self.epoch,
                 "batch_in_epoch": self.batch_in_epoch, "train_seconds": self.train_seconds,
                 "tokens_seen": self.tokens_seen, "history": self.history, "cfg": asdict(self.cfg), "best": self.best,
                 "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(), "np_rng": np.random.get_state()}
        tmp = self.ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_path)

    def load_checkpoint(self) -> bool:
        torch = self.torch
        if not self.ckpt_path.exists():
            return False
        st = torch.load(self.ckpt_path, weights_only=False, map_location="cpu")
        self._set_weights(st)
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        # the peak learning rate of *this* run's config applies from here on (it may differ on resume)
        self.sched.base_lrs = [self.cfg.lr for _ in self.opt.param_groups]
        for grp in self.opt.param_groups:
            grp["initial_lr"] = self.cfg.lr
        self.step, self.epoch, self.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        self.train_seconds, self.tokens_seen = st["train_seconds"], st["tokens_seen"]
        self.history = st.get("history", [])
        self.best = tuple(st.get("best", (-1.0, 0)))
        torch.set_rng_state(st["torch_rng"])
        random.setstate(st["py_rng"])
        np.random.set_state(st["np_rng"])
        return True

    def _set_weights(self, st: dict) -> None:
        """The model and draft-head weights of a saved state (ckpt.pt or best.pt)."""
        self.model.load_state_dict(st["model"])
        with self.torch.no_grad():
            self.head.copy_(st["head"])

    def load_weights(self, path: str | os.PathLike) -> None:
        """Model and head weights of another run's checkpoint (ckpt.pt or best.pt); nothing else."""
        self._set_weights(self.torch.load(path, weights_only=False, map_location="cpu"))

    def save_best(self) -> None:
        tmp = self.work / "best.tmp"
        self.torch.save({"model": self.model.state_dict(), "head": self.head.detach().clone(), "best": self.best}, tmp)
        os.replace(tmp, self.work / "best.pt")

    def load_best(self) -> tuple[float, int] | None:
        """Loads the weights of the best held-out evaluation so far (best.pt) into the model."""
        path = self.work / "best.pt"
        if not path.exists():
            return None
        st = self.torch.load(path, weights_only=False, map_location="cpu")
        self._set_weights(st)
        self.write_back_head()
        return st["best"]

    def write_back_head(self) -> None:
        with self.torch.no_grad():
            self.model.lm_head.weight[self.draft_ids] = self.head.detach()

    # ---------------------------------------------------------------- one step
    def loss_on(self, hidden_sel, tid, tlp):
        """(loss, n_agree, n) for selected hidden states [N, H] and teacher top-k [N, K]."""
        torch = self.torch
        logits = hidden_sel @ self.head.t()
        logq = torch.log_softmax(logits.float(), -1)
        did = self.t2d[tid]  # [N, K] draft indices or -1
        valid = did >= 0
        p = torch.softmax(tlp.masked_fill(~valid, -1e9), -1) * valid
        lq = logq.gather(-1, did.clamp(min=0))
        soft = -(p * lq).sum(-1)
        hard = -lq[:, 0] * valid[:, 0]
        loss = (soft + hard).mean()
        agree = ((self.draft_ids[logits.argmax(-1)] == tid[:, 0]).sum().item())
        return loss, agree, tid.shape[0]

    def _forward_group(self, g: Group, rng: np.random.Generator | None):
        """Hidden states at the trained positions of one group and the target's top-k there."""
        torch = self.torch
        P = len(g.prompt)
        n = len(g.answers)
        A = max(len(a[0]) for a in g.answers)
        dev = self.device
        x = torch.zeros((n, A), dtype=torch.long)
        for i, a in enumerate(g.answers):
            x[i, :len(a[0])] = torch.from_numpy(a[0].astype(np.int64))
        x = x.to(dev)
        hs, ids, lps = [], [], []
        if P:
            out = self.model.model(input_ids=torch.from_numpy(g.prompt.astype(np.int64))[None].to(dev),
                                   use_cache=True)
            hp = out.last_hidden_state[0]
            keep = np.zeros(P, dtype=bool)
            keep[P - 1] = True  # predicts the first answer token
            if rng is not None and self.cfg.prompt_fraction > 0:
                keep[:P - 1] = rng.random(P - 1) < self.cfg.prompt_fraction
            k = np.nonzero(keep)[0]
            hs.append(hp[torch.from_numpy(k).to(dev)])
            ids.append(g.p_ids[k])
            lps.append(g.p_logp[k])
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
            ha = self.model.model(input_ids=x, past_key_values=cache, use_cache=True).last_hidden_state
        else:
            ha = self.model.model(input_ids=x).last_hidden_state
        for i, a in enumerate(g.answers):
            m = len(a[0]) - 1
            if m > 0:
                hs.append(ha[i, :m])
                ids.append(a[1][:m])
                lps.append(a[2][:m])
        K = ids[0].shape[1]
        tid = torch.from_numpy(np.concatenate(ids).astype(np.int64)).view(-1, K).to(dev)
        tlp = torch.from_numpy(np.concatenate(lps).astype(np.float32)).view(-1, K).to(dev)
        return torch.cat(hs, 0), tid, tlp

    def train_step(self, gi: int, rng: np.random.Generator) -> dict:
        torch = self.torch
        self.model.train()
        g = self.train_ex[gi]
        h, tid, tlp = self._forward_group(g, rng)
        loss, agree, n = self.loss_on(h, tid, tlp)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for grp in self.opt.param_groups for p in grp["params"]],
                                           self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.tokens_seen += g.n_tokens
        return {"loss": float(loss.item()), "train_agree": agree / max(n, 1)}

    def evaluate(self, limit: int | None = None) -> float:
        """Greedy next-token agreement with the target on held-out answer positions."""
        torch = self.torch
        self.model.eval()
        agree = total = 0
        groups = self.val_ex[: limit or len(self.val_ex)]
        with torch.no_grad():
            for g in groups:
                h, tid, _ = self._forward_group(g, None)
                logits = h @ self.head.t()
                agree += int((self.draft_ids[logits.argmax(-1)] == tid[:, 0]).sum())
                total += tid.shape[0]
        return agree / max(total, 1)

    # ---------------------------------------------------------------- loop
    def fit(self) -> dict:
        torch = self.torch
        from tqdm import tqdm

        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        old_handlers = {}

        def _handler(signum, frame):
            self._stop = True

        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                old_handlers[s] = signal.signal(s, _handler)
            except ValueError:  # not the main thread
                pass
        bar = tqdm(total=cfg.steps, initial=self.step, desc="distill", unit="step", disable=not self.progress,
                   file=sys.stderr, dynamic_ncols=True)
        metrics_path = self.work / "metrics.jsonl"
        last_agree = self.history[-1]["heldout_agree"] if self.history else float("nan")
        ema = None
        self._t_run = None
        self._p_run = max(0.0, self._progress(self.step)) if self.step >= cfg.warmup else 0.0
        self._t_run = time.perf_counter()

        def out_of_time() -> bool:
            return bool(cfg.time_budget_s) and time.perf_counter() - self._t_run >= cfg.time_budget_s

        try:
            while self.step < cfg.steps and not self._stop and not out_of_time():
                batches = batches_for_epoch(self.train_ex, cfg.seed, self.epoch)
                while self.batch_in_epoch < len(batches) and self.step < cfg.steps and not self._stop \
                        and not out_of_time():
                    rng = np.random.default_rng(cfg.seed * 7919 + self.step)
                    t0 = time.perf_counter()
                    out = self.train_step(batches[self.batch_in_epoch], rng)
                    self.train_seconds += time.perf_counter() - t0
                    self.batch_in_epoch += 1
                    self.step += 1
                    ema = out["loss"] if ema is None else 0.95 * ema + 0.05 * out["loss"]
                    if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                        last_agree = self.evaluate(cfg.eval_groups)
                        if last_agree > self.best[0]:
                            self.best = (last_agree, self.step)
                            self.save_best()
                        rec = {"step": self.step, "epoch": self.epoch, "loss": round(ema, 4),
                               "heldout_agree": round(last_agree, 4), "lr": self.sched.get_last_lr()[0],
                               "train_seconds": round(self.train_seconds, 1), "tokens_seen": self.tokens_seen}
                        self.history.append(rec)
                        with open(metrics_path, "a") as f:
                            f.write(json.dumps(rec) + "\n")
                    if self.step % cfg.ckpt_every == 0:
                        self.save_checkpoint()
                    bar.update(1)
                    bar.set_postfix(loss=f"{ema:.3f}", agree=f"{last_agree:.3f}", ep=self.epoch)
                if self.batch_in_epoch >= len(batches):
                    self.epoch += 1
                    self.batch_in_epoch = 0
        finally:
            bar.close()
            self.save_checkpoint()
            for s, h in old_handlers.items():
                signal.signal(s, h)
        self.write_back_head()
        return {"step": self.step, "interrupted": self._stop, "train_seconds": self.train_seconds,
                "tokens_seen": self.tokens_seen, "history": self.history}


def _fused_kw(torch) -> dict:
    """fused AdamW where this torch supports it (much faster on CPU than the per-tensor loop)."""
    try:
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.zeros(2)
        torch.optim.AdamW([p], fused=True).step()
        return {"fused": True}
    except Exception:  # noqa: BLE001
        return {}
