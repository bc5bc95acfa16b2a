"""The workload: Spec-Bench questions (or any JSONL with the same fields), first turn, per category.

Split: the distilled drafter for the default target (``tandem distill``) trains on Spec-Bench
questions with ``question_id % 4 == 0``; the benchmark uses the rest (``--split bench``, the
default), so its acceptance figures are measured on prompts the drafter never saw. ``--split all``
and ``--split train`` exist for comparison.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from tandem.pb import PACKAGE_ROOT

DEFAULT_QUESTIONS = PACKAGE_ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
SPLITS = ("bench", "train", "all")
TRAIN_MODULUS = 4     # question_id % 4 == 0 -> drafter training split


@dataclass(frozen=True)
class Prompt:
    question_id: int
    category: str
    text: str          # the first user turn; the gateway applies the chat template (chat=True)

    def to_dict(self) -> dict:
        return {"question_id": self.question_id, "category": self.category, "prompt_chars": len(self.text)}


def in_split(question_id: int, split: str) -> bool:
    if split == "all":
        return True
    is_train = question_id % TRAIN_MODULUS == 0
    return is_train if split == "train" else not is_train


def load_questions(path: str | Path | None = None, *, split: str = "bench", categories: list[str] | None = None,
                   limit_per_category: int | None = None) -> list[Prompt]:
    """Prompts in file order within each category, categories in first-seen order (or ``categories``'
    order), at most ``limit_per_category`` each. Raises ValueError for unknown categories or an
    empty selection, FileNotFoundError for a missing file."""
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    path = Path(path or DEFAULT_QUESTIONS)
    if not path.exists():
        raise FileNotFoundError(f"questions file {path} not found (give --questions FILE.jsonl)")
    by_category: OrderedDict[str, list[Prompt]] = OrderedDict()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                qid, category, turns = int(row["question_id"]), str(row["category"]), row["turns"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{line_no}: expected question_id, category and turns ({exc})") from exc
            if not turns or not str(turns[0]).strip():
                continue
            by_category.setdefault(category, [])
            if in_split(qid, split):
                by_category[category].append(Prompt(qid, category, str(turns[0])))
    if categories:
        unknown = [c for c in categories if c not in by_category]
        if unknown:
            raise ValueError(f"unknown categories {unknown}; the file has: {', '.join(by_category)}")
        by_category = OrderedDict((c, by_category[c]) for c in categories)
    prompts: list[Prompt] = []
    for items in by_category.values():
        prompts.extend(items[:limit_per_category] if limit_per_category else items)
    if not prompts:
        raise ValueError(f"no prompts selected from {path} (split {split!r}, categories {categories or 'all'})")
    return prompts


def interleave_by_category(prompts: list[Prompt]) -> list[Prompt]:
    """Run order: round-robin over categories (first prompt of each, then the second, ...), so that a
    change in the machine's load during the run does not land on one category only."""
    groups: OrderedDict[str, list[Prompt]] = OrderedDict()
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    out: list[Prompt] = []
    i = 0
    while len(out) < len(prompts):
        for items in groups.values():
            if i < len(items):
                out.append(items[i])
        i += 1
    return out


def categories_of(prompts: list[Prompt]) -> list[str]:
    return list(OrderedDict.fromkeys(p.category for p in prompts))


# ---- repeated traffic: what a home's drafter box sees (tandem.bench.repeated) ------------------------
@dataclass(frozen=True)
class Conversation:
    """User turns sent one after another, each with the model's earlier replies in the messages (so a later
    turn's prompt holds the earlier answers). ``system``: a system message first, if any."""

    name: str
    category: str           # "rephrased", "multi-turn" or "agent"
    turns: tuple[str, ...]
    system: str = ""


_TOPICS = (
    ("a KV cache in a transformer", "KV caches in transformers"),
    ("photosynthesis", "photosynthesis in plants"),
    ("a hash table", "hash tables"),
    ("compound interest", "compound interest on savings"),
    ("the water cycle", "the water cycle on Earth"),
    ("a binary search", "binary search over a sorted list"),
)
_PHRASINGS = (
    "What is {0}? Explain it briefly.",
    "Can you explain {1} to me in simple words?",
    "Briefly, how does {0} work?",
)
_FOLLOW_UPS = ("Say that again, word for word.", "Now repeat your first answer and add one example.")
_TOOLS = """You are a home assistant that controls devices by calling functions. Answer every request with a
single JSON function call and nothing else, in exactly this form:
{"name": "<function>", "arguments": {<arguments>}}
Functions:
- set_light(room: string, on: boolean, brightness: integer 0-100)
- set_thermostat(room: string, celsius: number)
- get_weather(city: string)
- add_to_shopping_list(item: string, quantity: integer)
Example: for "Turn on the kitchen light at half brightness" answer
{"name": "set_light", "arguments": {"room": "kitchen", "on": true, "brightness": 50}}"""
_TASKS = ("Turn on the living room light at full brightness.", "Set the bedroom to 21 degrees.",
          "What's the weather in Paris?", "Add two cartons of milk to the shopping list.",
          "Turn off the kitchen light.", "Set the office thermostat to 19.5 degrees.",
          "What's the weather in Tokyo?", "Add a dozen eggs to the shopping list.")


def repeated_traffic() -> list[Conversation]:
    """A home's traffic, where text recurs across requests: each question asked in three phrasings
    (two questions at a time, interleaved, so a phrasing comes after the other question's answer),
    multi-turn chats whose later turns ask the model to repeat earlier answers, and an agent issuing the
    same JSON function-call scaffolding for different tasks. Fixed text (no randomness), English, no
    outside data. Within a category the order is the run order (a prefix of it still repeats itself)."""
    out = [Conversation(f"rephrased/{t}-{p}", "rephrased", (_PHRASINGS[p].format(*_TOPICS[t]),))
           for pair in range(0, len(_TOPICS), 2) for p in range(len(_PHRASINGS)) for t in (pair, pair + 1)]
    out += [Conversation(f"multi-turn/{t}", "multi-turn", (_PHRASINGS[0].format(*_TOPICS[t]), *_FOLLOW_UPS))
            for t in range(0, len(_TOPICS), 2)]
    out += [Conversation(f"agent/{i}", "agent", (task,), system=_TOOLS) for i, task in enumerate(_TASKS)]
    return out


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The chat template applied exactly as the gateway does it (text, then tokens, no specials)."""
    templated = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=False)
    return tokenizer(templated, add_special_tokens=False)["input_ids"]
