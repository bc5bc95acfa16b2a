"""Fuzzing every RPC of every node with random and mutated protobuf messages (hypothesis, bounded):
no server dies, every answer is OK or one of the statuses a client is meant to handle, and greedy
output is unchanged afterwards."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from google.protobuf.descriptor import FieldDescriptor as F

from harness import Stack
from tandem.pb import drafter_pb2, gateway_pb2, verifier_pb2

EXPECTED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.FAILED_PRECONDITION}
SESSION_IDS = ["fz0", "fz1", "fz2"]        # a few ids the fuzzer reuses, so it reaches live sessions
EXAMPLES = 250                             # per RPC; 9 RPCs


def _scalar(field):
    t = field.type
    if field.name in ("session_id", "session_token"):
        return st.one_of(st.sampled_from(SESSION_IDS + [""]), st.text(max_size=300))
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return st.one_of(st.integers(-3, 80), st.integers(-2**31, 2**31 - 1))
    if t in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_UINT32, F.TYPE_FIXED64, F.TYPE_FIXED32, F.TYPE_SINT64):
        lo = 0 if t in (F.TYPE_UINT64, F.TYPE_UINT32, F.TYPE_FIXED64, F.TYPE_FIXED32) else -2**63
        hi = 2**32 - 1 if t in (F.TYPE_UINT32, F.TYPE_FIXED32) else 2**63 - 1
        return st.one_of(st.integers(0, 10), st.integers(lo, hi))
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return st.one_of(st.floats(-2, 2, width=32), st.floats(allow_nan=True, allow_infinity=True, width=32))
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_STRING:
        return st.text(max_size=60)
    if t == F.TYPE_BYTES:
        return st.binary(max_size=60)
    raise NotImplementedError(field.type)


def messages(descriptor, depth: int = 0):
    """A strategy for random messages of ``descriptor``: every field set or not, lists up to 12."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            continue
        value = messages(f.message_type, depth + 1) if f.message_type is not None else _scalar(f)
        if f.is_repeated:
            value = st.lists(value, max_size=12 if depth < 2 else 2)
        fields[f.name] = st.one_of(st.none(), value) if depth < 3 else st.none()

    @st.composite
    def build(draw):
        msg = cls()
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is None:
                continue
            target = getattr(msg, name)
            if isinstance(value, list):
                for v in value:
                    target.add().CopyFrom(v) if hasattr(target, "add") and not isinstance(v, (int, float, str, bytes, bool)) \
                        else target.append(v)
            elif hasattr(value, "CopyFrom"):
                target.CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg
    return build()


def payloads(descriptor):
    """Random messages, their bytes mutated (flipped, truncated, spliced), and raw junk."""
    def mutate(data: bytes, pos: int, byte: int, cut: int) -> bytes:
        if not data:
            return bytes([byte])
        i = pos % len(data)
        return (data[:i] + bytes([byte]) + data[i + 1:])[: max(1, len(data) - cut)]

    valid = messages(descriptor).map(lambda m: m.SerializeToString())
    return st.one_of(valid, st.builds(mutate, valid, st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 8)),
                     st.binary(max_size=200))


@pytest.fixture(scope="module")
def stack(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), draft_length=2)
    s.gateway.config.max_tokens_limit = 48           # fuzzed Generate calls stay short
    yield s
    s.close()


RPCS = [(svc, m.name, m.input_type, m.server_streaming)
        for svc, module in (("drafter", drafter_pb2), ("verifier", verifier_pb2), ("gateway", gateway_pb2))
        for m in module.DESCRIPTOR.services_by_name[svc.capitalize()].methods]


def _call(stack, svc: str, method: str, streaming: bool, data: bytes):
    channel = stack.channels[{"gateway": 0, "verifier": 1, "drafter": 2}[svc]]
    path = f"/tandem.v1.{svc.capitalize()}/{method}"
    try:
        if streaming:
            for _ in channel.unary_stream(path)(data, timeout=30):
                pass
        else:
            channel.unary_unary(path)(data, timeout=30)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code(), err.details()


@pytest.mark.parametrize("svc, method, input_type, streaming", RPCS, ids=[f"{r[0]}.{r[1]}" for r in RPCS])
def test_fuzzed_messages_get_expected_statuses(stack, svc, method, input_type, streaming):
    seen: dict = {}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(payloads(input_type))
    def fuzz(data):
        result = _call(stack, svc, method, streaming, data)
        code = result if isinstance(result, grpc.StatusCode) else result[0]
        seen[code] = seen.get(code, 0) + 1
        assert code in EXPECTED, f"{svc}.{method}: {result} for {data[:80]!r}"

    fuzz()
    assert sum(seen.values()) >= EXAMPLES // 2, seen


def test_greedy_output_unchanged_after_the_fuzzing(stack):
    """Runs after the fuzz tests (same module stack): the services still answer, with the same tokens."""
    req = gateway_pb2.GenerateRequest(prompt="w1 w5 w9 w20", max_tokens=16, ignore_eos=True, draft_length=3)
    spec = stack.gateway_stub.Generate(req, timeout=60)
    plain = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(prompt="w1 w5 w9 w20", max_tokens=16,
                                                                    ignore_eos=True, no_speculation=True), timeout=60)
    assert list(spec.token_ids) == list(plain.token_ids) and len(spec.token_ids) == 16
