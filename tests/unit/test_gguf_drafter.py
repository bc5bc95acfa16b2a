"""The ``gguf`` drafter kind: the target's own GGUF file drafting for it (drafter_service.gguf_drafter). With the
target's arithmetic (fp32) every greedy token it drafts is the target's; with int8 activations (its default)
nearly every one; its KV follows the context it is sent, rolled back where the context changes."""

from __future__ import annotations

import pytest

from drafter_service.factory import drafter_kind, load_drafter
from drafter_service.gguf_drafter import GgufDrafter
from tandem.models import resolve
from tandem.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def default_file():
    loc = resolve("default")
    return loc.directory / loc.gguf_file


@pytest.fixture(scope="module")
def target(default_file):
    from verifier_service.target import Target

    return Target.load(str(default_file))


def plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation, one plain forward a token."""
    dec = target.decoder
    cache = dec.new_cache()
    logits = dec.forward(cache, prompt, True)
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = dec.forward(cache, [out[-1]], False)
    return out


def prompt_ids(target, text: str) -> list[int]:
    return list(target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     return_dict=True)["input_ids"])


def test_a_gguf_file_is_the_gguf_kind_and_says_it_is_followed(default_file, target):
    assert drafter_kind(default_file) == "gguf"
    drafter = load_drafter(default_file, threads=None)
    assert isinstance(drafter, GgufDrafter) and drafter.activations == "int8"
    info = drafter.info
    assert info.follow_path and not info.model_free and info.lookup is None
    assert (info.vocab_size, info.vocab_hash, info.max_context) == (target.info.vocab_size, target.info.vocab_hash,
                                                                    target.info.max_context)
    wrapped = load_drafter(default_file, lookup_max_ngram=4)
    assert wrapped.info.follow_path and wrapped.info.lookup is not None


def test_with_the_targets_arithmetic_every_drafted_token_is_the_targets(default_file, target):
    drafter = GgufDrafter(default_file, activations="fp32")
    prompt = prompt_ids(target, "Name three rivers of Europe and say where each one starts.")
    want = plain_greedy(target, prompt, 24)
    got, known = [], 0
    for _ in range(6):                  # blocks of 4, each kept: the session is sent only what it has not seen
        context = prompt + got
        block = drafter.propose("s", known, context[known:], 4, SamplingParams())
        known = len(context)
        got += [t.token_id for t in block.tokens]
    assert got == want


def test_with_int8_activations_nearly_every_greedy_token_is_the_targets(default_file, target):
    drafter = GgufDrafter(default_file)
    agree = total = 0
    for text in ("Write a short poem about the sea.", "Explain what a hash map is.",
                 "List the planets of the solar system in order."):
        prompt = prompt_ids(target, text)
        want = plain_greedy(target, prompt, 32)
        # teacher-forced: each position drafted from the target's own context
        for j in range(0, 32, 8):
            block = drafter.propose(text, 0, prompt + want[:j], 8, SamplingParams())
            agree += sum(t.token_id == w for t, w in zip(block.tokens, want[j:j + 8]))
            total += 8
    assert agree >= 0.8 * total, (agree, total)


def test_a_context_that_changes_rolls_the_kv_back(default_file, target):
    drafter = GgufDrafter(default_file)
    prompt = prompt_ids(target, "What is the capital of France?")
    drafter.propose("a", 0, prompt + [5, 6, 7, 8], 4, SamplingParams())
    # the session's last 4 tokens were wrong: 2 are kept, 3 others follow
    changed = drafter.propose("a", len(prompt) + 2, [40, 41, 42], 6, SamplingParams())
    fresh = drafter.propose("b", 0, prompt + [5, 6, 40, 41, 42], 6, SamplingParams())
    assert [t.token_id for t in changed.tokens] == [t.token_id for t in fresh.tokens]


def drafted_path(drafter, prompt: list[int], sampling: SamplingParams, name: str) -> tuple[list[int], int]:
    """Blocks of 3 continuing the drafter's own path (as a followed node drafts), with a rejection half-way
    (the last 2 tokens replaced); returns (the tokens drafted, the forwards run)."""
    forwards = 0
    feed = drafter.feed

    def counted(kv, ids, keep):
        nonlocal forwards
        forwards += 1
        return feed(kv, ids, keep)

    drafter.feed = counted
    try:
        context, known, out = list(prompt), 0, []
        for block in range(16):
            if block == 8:
                context = context[:-2] + [context[-1]]       # a rejection: the real context differs
                known = min(known, len(context) - 1)
            got = drafter.propose(name, known, context[known:], 3, sampling)
            known = len(context)
            new = [t.token_id for t in got.tokens]
            context += new
            out += new
        return out, forwards
    finally:
        drafter.feed = feed


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=11)],
                         ids=["greedy", "seeded"])
def test_guessed_rows_draft_the_same_tokens_in_fewer_forwards(default_file, target, sampling):
    """Feeding a guess of the next token beside each drafted one changes how many forwards a block takes,
    never the tokens: each is still chosen from its own row for the real draft prefix."""
    prompt = prompt_ids(target, "Repeat the line 'red green blue, one two three' four times.")
    plain = GgufDrafter(default_file, guesses=0)
    guessing = GgufDrafter(default_file, guesses=1)
    want, plain_forwards = drafted_path(plain, prompt, sampling, "p")
    got, guessed_forwards = drafted_path(guessing, prompt, sampling, "g")
    assert got == want
    assert guessed_forwards <= (0.85 if sampling.greedy else 0.95) * plain_forwards, (guessed_forwards, plain_forwards)


@pytest.mark.parametrize("sampling, text", [
    (SamplingParams(), "Write the word 'hello world' ten times, one per line."),
    (SamplingParams(temperature=0.3, seed=11), "Repeat the line 'red green blue, one two three' four times.")],
    ids=["greedy", "seeded"])
def test_where_the_text_loops_a_chain_of_guesses_drafts_the_same_tokens_in_fewer_forwards(default_file, target,
                                                                                           sampling, text):
    """Where the last 8 tokens recur (a line repeated), the drafter guesses 7 tokens in a chain: the same tokens
    as one guess a step, in fewer forwards."""
    prompt = prompt_ids(target, text)
    one = GgufDrafter(default_file, guesses=1, long_guesses=0)
    chained = GgufDrafter(default_file, guesses=1, long_guesses=7)
    want, one_forwards = drafted_path(one, prompt, sampling, "one")
    got, chained_forwards = drafted_path(chained, prompt, sampling, "chain")
    assert got == want
    assert chained_forwards < one_forwards, (chained_forwards, one_forwards)


def test_serve_drafter_flags_reach_a_gguf_drafter(default_file, monkeypatch):
    """`tandem serve-drafter --drafter FILE.gguf --drafter-activations fp32 --drafter-guesses 0` builds exactly
    that drafter (the flags were once parsed and dropped); the variables do the same."""
    from drafter_service import cli
    from tandem.cli import build_parser

    args = build_parser(only="serve-drafter").parse_args(
        ["serve-drafter", "--drafter", str(default_file), "--drafter-activations", "fp32", "--drafter-guesses", "0"])
    drafter = cli.load(args)
    assert (drafter.activations, drafter.guess_tokens, drafter.long_guesses) == ("fp32", 0, 0)
    monkeypatch.setenv("TANDEM_DRAFTER_GUESSES", "2")
    monkeypatch.setenv("TANDEM_DRAFTER_LONG_GUESSES", "5")
    args = build_parser(only="serve-drafter").parse_args(["serve-drafter", "--drafter", str(default_file)])
    drafter = cli.load(args)
    assert (drafter.activations, drafter.guess_tokens, drafter.long_guesses) == ("int8", 2, 5)
    assert len(drafter.habits) > 1000
    monkeypatch.setenv("TANDEM_DRAFTER_GUESS_SEED", "none")
    args = build_parser(only="serve-drafter").parse_args(["serve-drafter", "--drafter", str(default_file)])
    assert len(cli.load(args).habits) == 0


def test_a_guess_never_takes_a_position_past_the_drafters_context(default_file, target):
    """A block that ends at max_context is drafted without guessing past it (a guess takes a KV position)."""
    import dataclasses

    class AlwaysGuess:                            # a long match: the longest chain of guesses
        def guess_matched(self, seq, m):
            return [int(seq[-1])] * m, 8

    drafter = GgufDrafter(default_file, guesses=1)
    limit = 48                                   # this drafter's context, made short for the test
    drafter.meta = dataclasses.replace(drafter.meta, max_context=limit)
    drafter._info = dataclasses.replace(drafter._info, max_context=limit)
    prompt = (prompt_ids(target, "one two one two") * 8)[:limit - 6]
    first = drafter.propose("edge", 0, prompt, 1, SamplingParams()).tokens[0].token_id
    drafter.sessions.get("edge").continuations = AlwaysGuess()
    held, feed = [], drafter.feed

    def recorded(kv, ids, keep):
        out = feed(kv, ids, keep)
        held.append(kv.length)
        return out

    drafter.feed = recorded
    got = drafter.propose("edge", len(prompt), [first], 8, SamplingParams())   # shortened to 6: up to the limit
    assert len(got.tokens) == 6
    assert held and max(held) <= limit, held


def test_habits_start_from_the_targets_text_and_learn_what_the_drafter_drafts(default_file, target):
    """A .gguf drafter's habits (the guess where the session's own text has none) start from the shipped
    drafter's seed text when the vocabularies match ('auto'), or empty ('none'), and learn each token it
    drafts after the one before."""
    from drafter_service.gguf_drafter import habit_seeds

    seeded = GgufDrafter(default_file)
    assert len(seeded.habits) > 1000
    assert habit_seeds("auto", "sha256:another-vocabulary") == []
    with pytest.raises(FileNotFoundError, match="--drafter-guess-seed"):
        habit_seeds("/nonexistent/seed.jsonl.gz", target.info.vocab_hash)
    empty = GgufDrafter(default_file, guess_seed="none")
    assert len(empty.habits) == 0
    prompt = prompt_ids(target, "Name three rivers of Europe and say where each one starts.")
    path, _ = drafted_path(empty, prompt, SamplingParams(), "h")
    pairs = list(zip([prompt[-1]] + path, path))
    once = [(a, b) for a, b in pairs if [x for x, _ in pairs].count(a) == 1]
    assert once and all(empty.habits.guess(a) == [b] for a, b in once)
    assert GgufDrafter(default_file, guesses=0).habits is None


def test_habit_guesses_draft_the_same_tokens_in_fewer_forwards(default_file, target):
    """On text with nothing to copy from the session, the guesses come from the habits: a drafter whose
    habits know this answer drafts the same tokens as one that never guesses, in fewer forwards than before it
    learned them (here 32 against 42; 48 without guesses)."""
    prompt = prompt_ids(target, "Name three rivers of Europe and say where each one starts.")
    want, plain_forwards = drafted_path(GgufDrafter(default_file, guesses=0), prompt, SamplingParams(), "p")
    cold = GgufDrafter(default_file, guess_seed="none")
    first, cold_forwards = drafted_path(cold, prompt, SamplingParams(), "c")
    again, warm_forwards = drafted_path(cold, prompt, SamplingParams(), "w")   # it learned the answer
    assert first == want and again == want
    assert warm_forwards <= min(0.85 * cold_forwards, cold_forwards - 5), (warm_forwards, cold_forwards, plain_forwards)
    # the drafter's metrics say where its guesses came from and how many saved a forward
    from drafter_service.metrics import DrafterMetrics

    scraped = {line.split(" ")[0]: float(line.split(" ")[1]) for line in DrafterMetrics(cold).text().splitlines()
               if line.startswith("tandem:drafter_guessed_rows")}
    fed, used = cold.guess_counts.fed, cold.guess_counts.used
    assert used["habit"] > 0 and fed["habit"] >= used["habit"] and fed["session"] >= used["session"]
    saved = plain_forwards - cold_forwards + plain_forwards - warm_forwards
    assert saved <= used["habit"] + used["session"] <= saved + 4   # a guess used by a block no later block followed
    for source in ("session", "habit"):
        assert scraped[f'tandem:drafter_guessed_rows_total{{source="{source}"}}'] == fed[source]
        assert scraped[f'tandem:drafter_guessed_rows_used_total{{source="{source}"}}'] == used[source]
