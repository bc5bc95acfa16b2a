"""What `tandem generate` prints about a request: how it was decoded, and the round timeline's totals."""

from tandem.generate import round_table, stats_line
from tandem.pb import gateway_pb2


def stats(**kw) -> gateway_pb2.GenerateStats:
    kw.setdefault("new_tokens", 10)
    kw.setdefault("rounds", 9)
    return gateway_pb2.GenerateStats(**kw)


def test_the_statistics_say_how_the_request_was_decoded():
    spec = stats_line(stats(speculative=True, draft_model="d", proposed=8, accepted=4, acceptance_rate=0.5))
    assert spec.endswith("— speculative (drafter d)") and "accepted 4/8 (rate 0.50)" in spec
    plain = stats_line(stats())
    assert plain.endswith("— target only") and "accepted" not in plain          # nothing drafted: no 0/0
    standby = stats_line(stats(speculative=True, draft_model="d"))                 # auto chose plain steps
    assert "target only (drafter d on standby" in standby and "accepted" not in standby
    failed = stats_line(stats(speculative=True, draft_model="d", fallback_reason="drafter unavailable: x"))
    assert failed.endswith("— target only [fallback: drafter unavailable: x]")
    later = stats_line(stats(speculative=True, draft_model="d", proposed=3, fallback_reason="drafter unavailable"))
    assert "speculative until the drafter failed (drafter d) [fallback: drafter unavailable]" in later


def test_the_trace_totals_count_the_prefill_in_verify_and_round_time():
    s = stats(prefill_ms=50.0, round_stats=[gateway_pb2.RoundStats(index=1, verify_ms=5.0, round_ms=7.0),
                                            gateway_pb2.RoundStats(index=2, verify_ms=6.0, round_ms=8.0)])
    lines = round_table(s).splitlines()
    header, prefill, total = lines[0].split(), lines[1], lines[-1]
    assert "50.0" in prefill.split() and prefill.split().count("50.0") == 2       # verify ms and round ms
    cells = total.split()
    assert cells[0] == "total" and "61.0" in cells and "65.0" in cells         # 50 + 5 + 6, 50 + 7 + 8
