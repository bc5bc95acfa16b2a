"""Training prompts built offline (tandem.distill.prompts): varied, traceable to their source, and never
a held-out Spec-Bench question."""

import random

from tandem.distill import data, prompts


def test_offline_prompts_are_traceable_and_cover_the_document_and_code_tasks():
    rows = prompts.offline_prompts(random.Random(0), 30, 10)
    assert len(rows) == 40
    assert {r["category"] for r in rows} == {"summarization", "extraction", "rag", "coding"}
    assert all(r["source"].split(":")[0] in {"package", "stdlib", "pydoc_data"} for r in rows)
    code = [r for r in rows if r["category"] == "coding"]
    assert all("def " in r["text"] or r["text"].startswith("Write a Python function") for r in code)
    # documents are prose: no fenced code from package descriptions
    docs = [r for r in rows if r["category"] != "coding"]
    assert all(len(r["text"]) > 400 for r in docs)  # a document of at least 400 characters in each
    assert not any("```" in r["text"] for r in docs)


def test_requests_are_seeded_only_by_training_split_questions():
    train = data.spec_bench_questions("train")
    heldout = data.spec_bench_questions("heldout")
    reqs = prompts.instruction_requests(random.Random(0), train, per_seed=2, per_kind=3, n_german=5)
    seeded = [r for r in reqs if r["source"].startswith("spec_bench:")]
    assert seeded and all(data.is_training_question(int(r["source"].split(":")[1].split("#")[0])) for r in seeded)
    texts = "\n".join(r["text"] for r in reqs)
    assert not any(q["turns"][0] in texts for q in heldout)
    assert sum(r["kind"] == "german" for r in reqs) == 5
    assert sum(r["source"].startswith("topic:") for r in reqs) == 3 * len(prompts.KINDS)


def test_replies_are_cleaned_or_dropped():
    assert prompts.clean_reply("New request: Write a poem about rain in spring.", "question") == \
        "Write a poem about rain in spring."
    assert prompts.clean_reply("Too short", "question") is None
    assert prompts.clean_reply("x" * 2000, "question") is None
    assert prompts.clean_reply("Der Hund schläft im Garten.", "german") == \
        "Translate German to English: Der Hund schläft im Garten."
