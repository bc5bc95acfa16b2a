"""The target's own GGUF file as the drafter node (``tandem serve-drafter --drafter FILE.gguf``), each service its
own process on 1 thread, as on two boxes: the node says it is followed, the gateway follows its path drafted
ahead (a round never waits for it; the gateway's own lookup copies beside it), most of the node's tokens are
kept, and the output is the target's: greedy token for token, and with a seed the same text as without
speculation."""

import grpc
import pytest

from procs import Services
from tandem.models import resolve
from tandem.pb import common_pb2, drafter_grpc, gateway_grpc, gateway_pb2

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a hash map works.",
           "List five fruits and their colours."]


@pytest.fixture(scope="module")
def services():
    loc = resolve("default")
    with Services(loc.directory / loc.gguf_file, loc.directory / loc.gguf_file, draft_length=0) as s:
        with grpc.insecure_channel(s.gateway_address) as gw, \
                grpc.insecure_channel(f"127.0.0.1:{s.services['drafter'].port}") as dr:
            yield s, gateway_grpc.GatewayStub(gw), drafter_grpc.DrafterStub(dr)


def generate(stub, prompt, **kw):
    return stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=64, ignore_eos=True, **kw), timeout=120)


def test_the_node_is_followed_and_most_of_its_tokens_are_kept(services):
    s, gateway, drafter = services
    info = drafter.GetInfo(common_pb2.GetInfoRequest(), timeout=10)
    assert info.follow_path and not info.model_free and "int8" in info.model_name
    assert not info.HasField("lookup") or info.lookup.max_ngram == 0          # a .gguf node copies nothing
    proposed = accepted = 0
    for prompt in PROMPTS:
        plain = generate(gateway, prompt, no_speculation=True)
        spec = generate(gateway, prompt)
        assert list(spec.token_ids) == list(plain.token_ids), s.log("gateway")
        assert spec.stats.speculative and not spec.stats.fallback_reason
        rounds = [r for r in spec.stats.round_stats if r.proposed]
        # followed: a round verifies the node's path or the gateway's own lookup copy, never waits for the node
        assert {r.source for r in rounds} <= {"ahead", "copy"}
        proposed += sum(r.proposed for r in rounds if r.source == "ahead")
        accepted += sum(r.accepted for r in rounds if r.source == "ahead")
    print(f"node tokens kept: {accepted} of {proposed}")
    assert proposed >= 20 and accepted >= 0.7 * proposed, (accepted, proposed)


def test_a_seeded_request_writes_the_same_text_with_or_without_the_node(services):
    _, gateway, _ = services
    sampling = common_pb2.SamplingParams(temperature=0.8, top_p=0.95, seed=11, has_seed=True)
    drafted = 0
    for prompt in PROMPTS[:2]:
        plain = generate(gateway, prompt, no_speculation=True, sampling=sampling)
        spec = generate(gateway, prompt, sampling=sampling)
        assert spec.stats.speculative and list(spec.token_ids) == list(plain.token_ids)
        drafted += spec.stats.accepted
    assert drafted > 0
