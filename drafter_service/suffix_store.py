"""The suffix index on disk: text read in at start-up (seeds and the traffic learned before a restart) and
the traffic learned, written back.

A drafter that learns the home's traffic should not forget it when its box restarts, and a new drafter need
not start empty: text its target wrote elsewhere (the answers of a distillation corpus) already holds the
target's habits. Both are files of token sequences, gzip-compressed JSON lines (plain JSON lines are read
too), one object a line:

* ``{"tokens": [...]}``: a sequence as stored (what ``save`` writes);
* ``{"output_ids": [...], ...}``: an answer of the target (the distillation corpus format,
  ``tandem.distill.data``): its output is stored, its prompt is not (prompts are the users' text, and
  each session indexes its own).

A drafter with a store reads the store alone once it exists (it holds what was kept of the seeds), else
its seeds (drafter_service.factory.suffix_index_files). Reading goes through ``SuffixIndex.add`` in file
order, so the index's memory budget holds (the oldest
sequences are evicted first when a file holds more than the budget) and a saved index comes back in its
least-recently-used order. Every line is checked (token ids are int32s); a bad line is refused with its
file and line number, nothing of the file kept.

``save`` writes the finished sequences (sessions still in flight are not finished text) to a temporary
file next to the target path, then renames it over the target: a crash mid-save leaves the previous file.
The file holds the text of the sessions the drafter served (prompts and outputs): it is created readable
by its owner only (0600).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from drafter_service.suffix import SuffixIndex

_INT32 = (-(1 << 31), (1 << 31) - 1)


class SuffixFileError(ValueError):
    """A seed or store file that cannot be read (the message names the file, the line and the fix)."""


def _open_text(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rt", encoding="utf-8") if magic == b"\x1f\x8b" else open(path, encoding="utf-8")


def read_sequences(path: str | os.PathLike) -> list[list[int]]:
    """The token sequences of a seed or store file (module docstring); raises SuffixFileError."""
    path = Path(path)
    if not path.is_file():
        raise SuffixFileError(f"suffix file {path} does not exist (give a file written by the drafter's "
                              f"--suffix-store or a JSON-lines file of {{\"tokens\": [...]}} objects)")
    out = []
    try:
        with _open_text(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                out.append(_sequence(path, number, line))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SuffixFileError(f"suffix file {path}: cannot be read ({exc}); delete or replace it") from exc
    return out


def _sequence(path: Path, number: int, line: str) -> list[int]:
    where = f"suffix file {path} line {number} (fix or delete the line, or move the file away to start empty)"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SuffixFileError(f"{where}: not JSON ({exc})") from exc
    tokens = obj.get("tokens", obj.get("output_ids")) if isinstance(obj, dict) else None
    if not isinstance(tokens, list):
        raise SuffixFileError(f"{where}: expected an object with a 'tokens' (or 'output_ids') list of token ids")
    if not all(type(t) is int and _INT32[0] <= t <= _INT32[1] for t in tokens):
        raise SuffixFileError(f"{where}: token ids must be integers in the int32 range")
    return tokens


def load(index: SuffixIndex, path: str | os.PathLike) -> int:
    """Adds every sequence of ``path`` to ``index`` (all or nothing: the file is read and checked first);
    returns the tokens read."""
    sequences = read_sequences(path)
    for tokens in sequences:
        index.add(tokens)
    return sum(len(t) for t in sequences)


def save(index: SuffixIndex, path: str | os.PathLike) -> int:
    """Writes the index's finished sequences to ``path`` (atomically, mode 0600); returns the tokens written."""
    return write_sequences(index.released(), path)


def write_sequences(sequences: list[list[int]], path: str | os.PathLike) -> int:
    """Writes token sequences as a seed or store file (atomically, mode 0600); returns the tokens written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for tokens in sequences:
                gz.write((json.dumps({"tokens": tokens}, separators=(",", ":")) + "\n").encode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sum(len(t) for t in sequences)
