"""What a perfect drafter could give on a two-machine sitting: every drafted token accepted, drafting free.

    python ceiling.py RESULTS.json [MODE] [NODE_MS]

From `tandem bench --two-machine`'s results.json: per request, plain decoding's first-token time and
decode time; per block width, the median verify ms of the speculative mode's rounds (MODE: its name, or
the first mode that is not plain). A perfect drafter emits w tokens a round of width w, so its decode costs
min over w of (verify ms at w + the mode's median round overhead) / w a token; its first token costs what
plain decoding's does. The ceiling is plain's wall time over that, summed over the requests; and, as the bench's report reads a mode (the mean
over prompts of each prompt's median new tokens per second of wall time), that mean for the perfect drafter
over plain decoding's. NODE_MS: a drafter that drafts one token in that many ms (on its own box, never
waiting) bounds the pipeline too: a token then costs at least NODE_MS.
"""
import collections
import json
import statistics as st
import sys

r = json.load(open(sys.argv[1]))
modes = sorted({s["mode"] for s in r["samples"]})
plain_mode = "plain" if "plain" in modes else next(m for m in modes if "plain" in m)
spec = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else next(m for m in modes if m != plain_mode and "lookup" not in m)
by_width, overhead = collections.defaultdict(list), []
for s in r["samples"]:
    if s["mode"] != spec:
        continue
    R = s["rounds"]
    for i in range(len(R["k"])):
        by_width[R["proposed"][i] + 1].append(R["verify_ms"][i])
        overhead.append(R["round_ms"][i] - R["verify_ms"][i] - R["draft_ms"][i])
verify = {w: st.median(v) for w, v in sorted(by_width.items()) if len(v) >= 5}
over = st.median(overhead)
per_token = {w: (v + over) / w for w, v in verify.items()}
best_w = min(per_token, key=per_token.get)
if len(sys.argv) > 3:
    node_ms = float(sys.argv[3])
    per_token = {w: max(c, node_ms) for w, c in per_token.items()}
    print(f"a drafted token takes {node_ms} ms: no token sooner")
plain = [s for s in r["samples"] if s["mode"] == plain_mode]
wall = sum(s["wall_ms"] for s in plain)
ttft = sum(s["ttft_ms"] for s in plain)
tokens = sum(s["new_tokens"] - 1 for s in plain)
spec_wall = sum(s["wall_ms"] for s in r["samples"] if s["mode"] == spec)
perfect = ttft + tokens * per_token[best_w]
print(f"{spec} against {plain_mode}: {len(plain)} requests, first token {100 * ttft / wall:.0f} % of plain's wall time")
print("verify ms by width (>= 5 rounds): " + ", ".join(f"{w}: {v:.1f}" for w, v in verify.items())
      + f"; round overhead {over:.2f} ms")
print(f"plain decode {(wall - ttft) / tokens:.2f} ms a token; a perfect drafter's best width {best_w}: "
      f"{per_token[best_w]:.2f} ms a token ({(wall - ttft) / tokens / per_token[best_w]:.2f}x)")
print(f"ceiling {wall / perfect:.2f}x plain end to end (wall time summed); measured {wall / spec_wall:.2f}x")


def mean_of_medians(rates: dict[int, list[float]]) -> float:
    return st.mean(st.median(v) for v in rates.values())


plain_tps, perfect_tps, spec_tps = (collections.defaultdict(list) for _ in range(3))
for s in r["samples"]:
    q = s["question_id"]
    if s["mode"] == plain_mode:
        plain_tps[q].append(s["new_tokens"] / s["wall_ms"])
        perfect_tps[q].append(s["new_tokens"] / (s["ttft_ms"] + (s["new_tokens"] - 1) * per_token[best_w]))
    elif s["mode"] == spec:
        spec_tps[q].append(s["new_tokens"] / s["wall_ms"])
base = mean_of_medians(plain_tps)
print(f"as the report reads it: ceiling {mean_of_medians(perfect_tps) / base:.2f}x plain; "
      f"measured {mean_of_medians(spec_tps) / base:.2f}x")
