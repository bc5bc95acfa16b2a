"""The process's own memory: handing freed heap pages back to the system.

glibc keeps what a program frees in its heap and in the arenas of the threads that freed it, to serve later
allocations; the resident memory a user sizes a machine by stays at the high-water mark of a start-up step
that is over. Two such steps free hundreds of MB: building a tokenizer from its JSON (Gemma 3's 262 k
vocabulary: ~420 MB at the peak of its parse, ~100 MB kept) and the verifier's packing and start-up forwards
(BENCHMARKS.md, thirty-sixth session). ``release_freed_memory`` runs after each.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):       # not glibc (macOS, musl): nothing to call
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Returns the C heap's free pages to the system (glibc's ``malloc_trim(0)``: every arena, whole free pages
    inside them too); False where the C library has no such call. Cheap (milliseconds); for the end of a
    start-up step, not for every request."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
