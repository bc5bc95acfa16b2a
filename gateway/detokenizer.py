"""Incremental detokenization: token ids in, new text out, in constant work per token.

Re-decoding every generated id each round (``tokenizer.decode(generated)``) costs O(n) per round and
O(n^2) per request. The technique vLLM and TGI use keeps two offsets into the ids:

* ``read``   ids before it have been turned into text that was emitted;
* ``prefix`` an earlier boundary: ``ids[prefix:read]`` is a short window of context.

Each step decodes only ``ids[prefix:]`` and ``ids[prefix:read]``; the new text is what the first adds
to the second. Decoding with context, rather than the new ids alone, keeps what depends on the
neighbours right: byte-level BPE merges, SentencePiece's leading-space marker (a decoder strips the
space of the first token it sees, and both decodes start at the same token), byte-fallback tokens
that make up one character together. A text ending in U+FFFD is an incomplete character (its last
bytes have not come yet): it is held back, the offsets stay, and the next ids complete it. Once text
is emitted, ``prefix`` moves to the old ``read`` and ``read`` to the end, so the window stays a few
tokens long whatever the length of the output.

With ``skip_special_tokens`` the ids the tokenizer would skip are dropped as they arrive (skipping
is removal before decoding, so this changes no text), which keeps them out of the window.

Invariant: the texts of all ``push`` calls and of ``flush`` concatenated equal
``tokenizer.decode(all_ids, skip_special_tokens=...)`` whenever that text is valid UTF-8 (no U+FFFD
from invalid bytes). Assumes ``clean_up_tokenization_spaces`` is off (transformers' default, and
the gateway's tokenizer): its " ." -> "." rewrites look across window boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable

REPLACEMENT = "\ufffd"


def skipped_ids(tokenizer) -> frozenset[int]:
    """The ids ``tokenizer.decode(..., skip_special_tokens=True)`` drops: its special tokens that decode
    to nothing when skipped (checked one by one, so an id the tokenizer keeps is never dropped)."""
    candidates = set(getattr(tokenizer, "all_special_ids", None) or ())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        try:
            candidates.update(i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        except AttributeError:
            pass
    return frozenset(i for i in candidates
                     if isinstance(i, int) and i >= 0 and tokenizer.decode([i], skip_special_tokens=True) == "")


class IncrementalDetokenizer:
    """One generation's detokenizer: ``push`` each round's ids and get the text they complete;
    ``flush`` at the end for whatever is still held back (an incomplete character, with U+FFFD)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True, skip_ids: Iterable[int] | None = None):
        """``skip_ids``: the ids to drop when skipping special tokens (default: ``skipped_ids(tokenizer)``;
        pass it precomputed to share it between requests)."""
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._skip = (frozenset(skip_ids) if skip_ids is not None else skipped_ids(tokenizer)) \
            if skip_special_tokens else frozenset()
        self._ids: list[int] = []          # the kept ids (special ones already dropped when skipping)
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""             # decode(ids[prefix:read]), kept while the offsets stay

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def _emit_upto(self, end: int, force: bool = False) -> str:
        """The new text of ids[read:end] if it is complete (or ``force``); advances the offsets then."""
        new_text = self._decode(self._ids[self._prefix:end])
        if len(new_text) <= len(self._prefix_text) or (new_text.endswith(REPLACEMENT) and not force):
            return ""
        delta = new_text[len(self._prefix_text):]
        self._prefix, self._read = self._read, end
        self._prefix_text = self._decode(self._ids[self._prefix:self._read])
        return delta

    def push(self, token_ids: Iterable[int]) -> str:
        """Adds ids (one round's, any number) and returns the text they complete: all of it, except a
        trailing incomplete character, which comes with the ids that complete it (or with ``flush``)."""
        start = len(self._ids)
        self._ids.extend(i for i in token_ids if i not in self._skip)
        end = len(self._ids)
        if end == start:
            return ""
        delta = self._emit_upto(end)
        if delta or end - start == 1:
            return delta
        # The round ends inside a character: release the complete text before it, id by id.
        parts = [self._emit_upto(stop) for stop in range(start + 1, end)]
        return "".join(parts)

    def push_pieces(self, token_ids: Iterable[int]) -> list[str]:
        """``push`` id by id: the text each id completes, in order ('' for an id whose character a later id
        completes, or a skipped one). The pieces add up to what ``push`` of all of them returns."""
        return [self.push((i,)) for i in token_ids]

    def flush(self) -> str:
        """The text still held back (an incomplete last character decodes as U+FFFD); call at the end."""
        return self._emit_upto(len(self._ids), force=True)
