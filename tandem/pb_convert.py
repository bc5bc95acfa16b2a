"""Domain types <-> protobuf messages (to_pb / from_pb) for the types the services share. The only place
domain <-> protobuf happens for common types; servicers and clients call these and nothing else."""

from __future__ import annotations

from collections.abc import Iterable

from tandem.pb import common_pb2, gateway_pb2, verifier_pb2
from tandem.round_record import FIGURES, Round
from tandem.types import DraftToken, LookupRule, ModelInfo, SamplingParams, TargetInfo


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(temperature=msg.temperature, top_k=msg.top_k,
                          top_p=msg.top_p if msg.top_p != 0.0 else 1.0,
                          seed=msg.seed if msg.has_seed else None)


def sampling_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                     seed=params.seed or 0, has_seed=params.seed is not None)


def draft_from_pb(tokens: Iterable[common_pb2.DraftToken]) -> list[DraftToken]:
    return [DraftToken(t.token_id, tuple(t.support_ids), tuple(t.support_probs), t.from_lookup, t.origin,
                       t.match_length)
            for t in tokens]


def draft_to_pb(tokens: Iterable[DraftToken]) -> list[common_pb2.DraftToken]:
    return [common_pb2.DraftToken(token_id=t.token_id, support_ids=t.support_ids, support_probs=t.support_probs,
                                  from_lookup=t.from_lookup, origin=t.origin,
                                  match_length=t.match_length)
            for t in tokens]


def info_from_pb(msg: common_pb2.ModelInfo) -> ModelInfo:
    rule = msg.lookup
    lookup = (LookupRule(rule.max_ngram, rule.min_ngram, rule.trust_ngram)
              if msg.HasField("lookup") and rule.max_ngram > 0 else None)
    return ModelInfo(msg.model_name, msg.vocab_size, msg.vocab_hash, msg.max_context, tuple(msg.eos_token_ids),
                     lookup, msg.model_free, msg.follow_path)


def info_to_pb(info: ModelInfo) -> common_pb2.ModelInfo:
    lookup = (common_pb2.LookupRule(max_ngram=info.lookup.max_ngram, min_ngram=info.lookup.min_ngram,
                                    trust_ngram=info.lookup.trust_ngram) if info.lookup is not None else None)
    return common_pb2.ModelInfo(model_name=info.model_name, vocab_size=info.vocab_size, vocab_hash=info.vocab_hash,
                                max_context=info.max_context, eos_token_ids=list(info.eos_token_ids), lookup=lookup,
                                model_free=info.model_free, follow_path=info.follow_path)


def target_info_from_pb(msg: verifier_pb2.TargetInfo) -> TargetInfo:
    return TargetInfo(info_from_pb(msg.model), msg.tokenizer_json, msg.chat_template, msg.bos_token, msg.eos_token,
                      dict(msg.verify_ms_by_width))


def target_info_to_pb(info: TargetInfo) -> verifier_pb2.TargetInfo:
    return verifier_pb2.TargetInfo(model=info_to_pb(info.model), tokenizer_json=info.tokenizer_json,
                                   chat_template=info.chat_template, bos_token=info.bos_token,
                                   eos_token=info.eos_token, verify_ms_by_width=info.verify_ms_by_width)


def round_to_pb(rnd: Round) -> gateway_pb2.RoundStats:
    return gateway_pb2.RoundStats(**{name: getattr(rnd, name) for name in FIGURES})


def round_from_pb(msg: gateway_pb2.RoundStats) -> Round:
    return Round(**{name: getattr(msg, name) for name in FIGURES})
