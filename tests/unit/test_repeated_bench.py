"""The repeated-traffic workload and its report (tandem.bench.workload.repeated_traffic, tandem.bench.repeated):
the text really recurs across requests, and the summary's ratios and identity check are what the samples say."""

from collections import Counter

from tandem.bench.repeated import select, summarize
from tandem.bench.workload import repeated_traffic


def test_the_workload_repeats_itself_across_requests():
    work = repeated_traffic()
    assert len({c.name for c in work}) == len(work)
    by_cat = Counter(c.category for c in work)
    assert set(by_cat) == {"rephrased", "multi-turn", "agent"} and min(by_cat.values()) >= 3
    # every question comes in three phrasings, and the two of a pair alternate
    topics = Counter(c.name.split("/")[1].split("-")[0] for c in work if c.category == "rephrased")
    assert set(topics.values()) == {3}
    assert [c.name for c in work[:3]] == ["rephrased/0-0", "rephrased/1-0", "rephrased/0-1"]
    # later turns of a chat ask for earlier answers; the agent's scaffolding is one system prompt for all tasks
    assert all(len(c.turns) >= 3 and "repeat" in " ".join(c.turns[1:]).lower()
               for c in work if c.category == "multi-turn")
    agents = [c for c in work if c.category == "agent"]
    assert len({c.system for c in agents}) == 1 and '{"name": "set_light"' in agents[0].system
    assert [c.category for c in select(work, 2)] == ["rephrased"] * 2 + ["multi-turn"] * 2 + ["agent"] * 2
    assert select(work, 0) == work


def test_the_summary_compares_modes_per_pass_and_checks_identity():
    def sample(pass_i, mode, wall_ms, decode_ms, text, rounds=100, accepted=0):
        return {"pass": pass_i, "conversation": "agent/0", "category": "agent", "turn": 0, "mode": mode,
                "tokens": 101, "wall_ms": wall_ms, "text": text,
                "tandem": {"rounds": rounds, "accepted": accepted, "ttft_ms": 10.0, "total_ms": 10.0 + decode_ms}}

    samples = [sample(1, "plain", 1010.0, 1000.0, "a"), sample(1, "speculative", 505.0, 500.0, "a", 50, 50),
               sample(2, "plain", 1010.0, 1000.0, "a"), sample(2, "speculative", 202.0, 250.0, "b", 25, 75)]
    out = summarize(samples)
    first, second = out["pass 1"]["agent"], out["pass 2"]["all"]
    assert first["plain_tok_s"] == 100.0 and first["speculative_tok_s"] == 200.0 and first["speedup"] == 2.0
    # decode: the 100 tokens after the first, over the time after the first token
    assert first["plain_decode_tok_s"] == 100.0 and first["decode_speedup"] == 2.0
    assert first["mean_acceptance_length"] == 2.0 and first["identical"] == "1/1"
    assert second["speedup"] == 5.0 and second["decode_speedup"] == 4.0 and second["mean_acceptance_length"] == 4.0
    assert second["identical"] == "0/1"                                     # a different text is reported
