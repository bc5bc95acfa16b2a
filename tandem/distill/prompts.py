"""Training prompts beyond Spec-Bench's 120 training questions, from sources on every machine.

The drafter's held-out agreement stops rising after a few epochs over 120 prompts: it needs more,
and more varied, contexts in which to learn what the target writes. This module builds them
offline, without touching a held-out Spec-Bench question:

* **written by the target** (``self``): the target is asked to write a new question in the style of
  a training-split question (each of the 120 seeds, several samples) or on a topic from a short list
  written for Tandem; and to translate English sentences into German, which become
  "Translate German to English:" prompts (Spec-Bench's translation format).
* **documents** (``doc``): prose paragraphs from the installed packages' descriptions
  (``*.dist-info/METADATA``) and the standard library's module docstrings, wrapped in summarisation,
  extraction and passage-question templates.
* **code** (``code``): functions from the standard library's sources, wrapped in code-review,
  explanation and test-writing templates.

Every prompt row records its ``source`` (the seed question id, the package or the stdlib file), so a
data manifest says exactly what was used. ``python -m tandem.distill.prompts --help``.
"""

from __future__ import annotations

import argparse
import ast
import email
import json
import os
import random
import re
import sys
import sysconfig
from pathlib import Path

SELF_INSTRUCT = (
    "Here is a request someone sent to an AI assistant:\n\n{seed}\n\n"
    "Write one new request of the same kind on a different subject. Reply with the new request only."
)
TOPIC_INSTRUCT = "Write one {kind} about {topic}. Reply with the {noun} only."
KINDS = {  # category: (kind of request, what the reply is)
    "writing": ("creative writing request for an AI assistant (a story, poem, email or blog post)", "request"),
    "roleplay": ("request asking an AI assistant to play a famous character and answer a question in character",
                 "request"),
    "reasoning": ("short logic puzzle with a single correct answer", "puzzle"),
    "math": ("short math word problem", "problem"),
    "math_reasoning": ("grade-school math word problem that takes several steps to solve", "problem"),
    "stem": ("question a student might ask about science or engineering", "question"),
    "humanities": ("open question a student might ask about history, philosophy or art", "question"),
    "qa": ("short factual question a curious person might ask", "question"),
}
TOPICS = (
    "the ocean", "volcanoes", "the Roman Empire", "photosynthesis", "electric cars", "the stock market",
    "chess", "coffee", "the moon landing", "honeybees", "climate change", "the printing press", "jazz",
    "football", "a small bakery", "a school trip", "trains", "the human heart", "gravity", "democracy",
    "the Renaissance", "rainforests", "computers", "the Olympic Games", "a birthday party", "gardening",
    "the French Revolution", "black holes", "vaccines", "ancient Egypt", "a farmer's market", "bicycles",
    "a city library", "dinosaurs", "the internet", "recycling", "mountains", "a music festival",
    "friendship", "a job interview", "the solar system", "money and savings", "a road trip", "cooking pasta",
    "a hospital", "robots", "the Silk Road", "earthquakes", "a football club", "Shakespeare", "a zoo",
)
TRANSLATE_TO_GERMAN = "Translate English to German: {text}"

DOC_TEMPLATES = {
    "summarization": ("Summarize: {doc}", "Summarize the following text in a few sentences.\n\n{doc}",
                      "{doc}\n\nWrite a short summary of the text above."),
    "extraction": ("Extract the names of all software, libraries and tools mentioned in the following text, "
                   "one per line.\n\n{doc}",
                   "Read the text below and list its three most important facts as bullet points.\n\n{doc}",
                   "From the following text, extract every feature it describes and return them as a JSON list of "
                   "strings.\n\n{doc}"),
    "rag": ("{doc}\n{question}",),
}
RAG_QUESTIONS = ("What is {name} used for?", "What does the passage say about {name}?",
                 "According to the text, how does {name} work?", "Why would someone use {name}?")
CODE_TEMPLATES = (
    "Here is a Python function. Can you identify any bug in it?\n\n```\n{code}\n```",
    "Explain what the following Python function does, step by step.\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this Python function:\n\n```python\n{code}\n```",
    "Rewrite this Python function to make it easier to read, and explain your changes.\n\n```python\n{code}\n```",
    "Write a Python function that does the following: {summary}",
)


# ----------------------------------------------------------------------------------------------
# Offline text: package descriptions and standard-library sources
# ----------------------------------------------------------------------------------------------

def _prose(text: str) -> list[str]:
    """Paragraphs of plain prose: no fenced or indented code, headings, tables or markup-heavy lines."""
    out, cur, fenced = [], [], False

    def flush() -> None:
        if len(" ".join(cur)) > 200:
            out.append(" ".join(cur))
        cur.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            fenced = not fenced
            flush()
            continue
        if (fenced or not s or line.startswith(("    ", "\t")) or s.endswith("::")
                or s.startswith(("#", "=", "-", "*", "|", "<", "[", ">>>", "+", ":", ".."))
                or s.count("`") > 4 or len(re.findall(r"[A-Za-z ]", s)) < 0.8 * len(s)):
            flush()
            continue
        cur.append(s)
    flush()
    return out


def _chunks(paragraphs: list[str], min_chars: int, max_chars: int) -> list[str]:
    """Consecutive paragraphs joined into documents of ``min_chars``..``max_chars`` characters."""
    out, text = [], ""
    for para in paragraphs:
        if text and len(text) + len(para) > max_chars:
            out.append(text)
            text = ""
        text = f"{text}\n\n{para}" if text else para[:max_chars]
    if text:
        out.append(text)
    return [t for t in out if len(t) >= min_chars]


def package_documents(min_chars: int = 400, max_chars: int = 2500) -> list[dict]:
    """Prose from the installed distributions' long descriptions (``*.dist-info/METADATA``):
    consecutive prose paragraphs joined into documents of up to ``max_chars``."""
    import site

    roots = {Path(p) for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()}
    docs = []
    for root in sorted(roots):
        for meta in sorted(root.glob("*.dist-info/METADATA")):
            msg = email.message_from_string(meta.read_text(encoding="utf-8", errors="ignore"))
            body = msg.get_payload()
            if not isinstance(body, str):
                continue
            name = msg.get("Name") or meta.parent.name.split("-")[0]
            for k, text in enumerate(_chunks(_prose(body), min_chars, max_chars)):
                docs.append({"name": name, "text": text, "source": f"package:{name}#{k}"})
    return docs


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if not {"test", "tests", "idlelib", "site-packages", "lib2to3"} & set(p.parts))


def stdlib_documents(min_chars: int = 400) -> list[dict]:
    """Module docstrings of the standard library that read as prose."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for f in _stdlib_files():
        try:
            doc = ast.get_docstring(ast.parse(f.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc:
            text = "\n\n".join(_prose(doc))
            if len(text) >= min_chars:
                docs.append({"name": f.stem, "text": text[:4000], "source": f"stdlib:{f.relative_to(root)}"})
    return docs


def python_docs(min_chars: int = 400, max_chars: int = 2500) -> list[dict]:
    """The Python language reference topics shipped with the standard library (``pydoc_data``)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    docs = []
    for name in sorted(topics):
        for k, text in enumerate(_chunks(_prose(topics[name]), min_chars, max_chars)):
            docs.append({"name": name, "text": text, "source": f"pydoc_data:{name}#{k}"})
    return docs


def stdlib_functions(min_lines: int = 5, max_lines: int = 40) -> list[dict]:
    """Top-level functions and methods of the standard library with their docstring's first line."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in _stdlib_files():
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                n = node.end_lineno - node.lineno + 1
                doc = ast.get_docstring(node)
                if min_lines <= n <= max_lines and doc:
                    body = lines[node.lineno - 1:node.end_lineno]
                    indent = len(body[0]) - len(body[0].lstrip())
                    code = "\n".join(line[indent:] for line in body)
                    out.append({"name": node.name, "code": code, "summary": doc.strip().splitlines()[0],
                                "source": f"stdlib:{f.relative_to(root)}:{node.lineno}"})
    return out


def _sentences(docs: list[dict]) -> list[tuple[str, str]]:
    out = []
    for d in docs:
        for s in re.split(r"(?<=[.!?])\s+", d["text"]):
            if 40 <= len(s) <= 200 and s[0].isupper() and "`" not in s and "http" not in s:
                out.append((s, d["source"]))
    return out


# ----------------------------------------------------------------------------------------------
# Building the prompt set
# ----------------------------------------------------------------------------------------------

def all_documents() -> list[dict]:
    """Every prose document this machine offers: package descriptions, stdlib docstrings, Python's docs."""
    return package_documents() + stdlib_documents() + python_docs()


def offline_prompts(rng: random.Random, n_doc: int, n_code: int, docs: list[dict] | None = None) -> list[dict]:
    """Document and code prompts (no model needed); ``docs`` defaults to ``all_documents()``."""
    docs = list(all_documents() if docs is None else docs)
    rng.shuffle(docs)
    out = []
    cats = list(DOC_TEMPLATES)
    for i in range(n_doc if docs else 0):
        d = docs[i % len(docs)]
        cat = cats[i % len(cats)]
        tpl = rng.choice(DOC_TEMPLATES[cat])
        q = rng.choice(RAG_QUESTIONS).format(name=d["name"])
        out.append({"text": tpl.format(doc=d["text"], question=q), "category": cat, "source": d["source"],
                    "origin": "doc"})
    funcs = stdlib_functions()
    rng.shuffle(funcs)
    for i in range(min(n_code, len(funcs))):
        f = funcs[i]
        tpl = CODE_TEMPLATES[i % len(CODE_TEMPLATES)]
        out.append({"text": tpl.format(code=f["code"], summary=f["summary"]), "category": "coding",
                    "source": f["source"], "origin": "code"})
    return out


def instruction_requests(rng: random.Random, seeds: list[dict], per_seed: int, per_kind: int,
                         n_german: int, docs: list[dict] | None = None) -> list[dict]:
    """Requests whose answers become prompts: new questions in the style of each training-split seed
    and of each category, and German translations of English sentences."""
    reqs = []
    for q in seeds:
        seed = q["turns"][0]
        if len(seed) > 1500:  # long-document seeds (summaries, passages) are covered by the doc prompts
            continue
        for s in range(per_seed):
            reqs.append({"text": SELF_INSTRUCT.format(seed=seed), "category": q["category"],
                         "source": f"spec_bench:{q['question_id']}#{s}", "kind": "question"})
    for cat, (kind, noun) in KINDS.items():
        for s in range(per_kind):
            topic = rng.choice(TOPICS)
            reqs.append({"text": TOPIC_INSTRUCT.format(kind=kind, topic=topic, noun=noun), "category": cat,
                         "source": f"topic:{topic}#{s}", "kind": "question"})
    sents = _sentences(all_documents() if docs is None else docs)
    rng.shuffle(sents)
    for text, src in sents[:n_german]:
        reqs.append({"text": TRANSLATE_TO_GERMAN.format(text=text), "category": "translation", "source": src,
                     "kind": "german"})
    return reqs


def clean_reply(text: str, kind: str) -> str | None:
    """The usable part of the target's reply to a request, or None."""
    text = text.replace("<|im_end|>", "").strip().strip('"').strip()
    if kind == "question":
        text = re.sub(r"^(new request|request|question|problem|puzzle)\s*:\s*", "", text, flags=re.I).strip()
        text = text.split("\n\n")[0].strip() if len(text) > 600 else text
    if len(text) < 15 or len(text) > 1500:
        return None
    return f"Translate German to English: {text}" if kind == "german" else text


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m tandem.distill.prompts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="prompts JSONL to write (text, category, source, origin)")
    p.add_argument("--target", default="default", help="target that writes the 'self' prompts (default: default)")
    p.add_argument("--per-seed", type=int, default=6, help="new requests per training-split seed (default: 6)")
    p.add_argument("--per-kind", type=int, default=40, help="topic requests per category (default: 40)")
    p.add_argument("--german", type=int, default=200, help="English sentences to translate (default: 200)")
    p.add_argument("--docs", type=int, default=600, help="document prompts (default: 600)")
    p.add_argument("--code", type=int, default=300, help="code prompts (default: 300)")
    p.add_argument("--reply-tokens", type=int, default=96,
                   help="cap on a written request; replies cut off at it are dropped (default: 96)")
    p.add_argument("--seed", type=int, default=0, help="seed of the choices and of the target's sampling (the same "
                   "seed gives the same prompts on the same kind of device; CPU and GPU sample differently) (default: 0)")
    p.add_argument("--device", default="auto", help="where the target writes requests: auto (a CUDA GPU when "
                   "torch sees one, else the CPU), cpu, cuda, cuda:1 ... (default: auto)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads (default: all cores)")
    p.add_argument("--batch-size", type=int, default=64, help="requests written at once (default: 64; a GPU takes 512+)")
    args = p.parse_args(argv)

    from . import data

    rng = random.Random(args.seed)
    docs = all_documents()
    rows = offline_prompts(rng, args.docs, args.code, docs)
    print(f"[prompts] {len(rows)} document and code prompts", file=sys.stderr)
    reqs = instruction_requests(rng, data.spec_bench_questions("train"), args.per_seed, args.per_kind, args.german,
                                docs)
    if reqs:
        import torch

        from ..models import load_causal_lm_or_explain

        torch.set_num_threads(args.threads)
        loaded = load_causal_lm_or_explain(args.target, lambda m: print(f"[prompts] {m}", file=sys.stderr),
                                           args.device)
        if loaded is None:
            return 2
        model, tok, _ = loaded
        eos = tok.eos_token_id
        outs = data.generate(model, [data.chat_prompt_ids(tok, r["text"]) for r in reqs], args.reply_tokens,
                             greedy=False,
                             temperature=1.0, top_p=0.95, seed=args.seed, batch_size=args.batch_size,
                             eos_ids=(eos,) if eos is not None else (), pad_id=tok.pad_token_id or 0)
        kept = 0
        for r, o in zip(reqs, outs):
            if eos is not None and eos not in o:  # cut off at the cap: not a whole request
                continue
            text = clean_reply(tok.decode(o, skip_special_tokens=True), r["kind"])
            if text:
                rows.append({"text": text, "category": r["category"], "source": r["source"], "origin": "self"})
                kept += 1
        print(f"[prompts] the target wrote {kept} of {len(reqs)} requested prompts", file=sys.stderr)
    rng.shuffle(rows)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    print(f"[prompts] wrote {len(rows)} prompts to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
