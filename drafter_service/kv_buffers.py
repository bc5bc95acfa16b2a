"""A drafter session's KV cache for a shared-buffer graph: buffers bound in place as both past and present.

Graphs written by ``tandem.export_shared_kv`` attend with ONNX Runtime's GroupQueryAttention over KV
buffers of a fixed capacity [1, kv_heads, capacity, head_dim] per layer and key/value. Bound through
I/O binding as both the past input and the present output, a run writes the new tokens' rows in place
and reads the cached rows where they are: no copy of the cache per drafted token. Rolling back to a
prefix only shortens the length passed to the next run. A buffer grows (doubling, in steps of
``CAPACITY_STEP`` rows, the held rows copied once) when a feed would overflow it, up to the graph's
rotary table length.

A one-token run with one logits row (each drafted token) goes through a binding whose inputs and
logits output are preallocated arrays written in place: no allocation and no rebinding per token.
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAPACITY_STEP = 256
SHARED_KV_INPUTS = ("input_ids", "seqlens_k", "total_sequence_length", "logits_to_keep")


@dataclass(frozen=True)
class SharedKVGraph:
    """What every session of one shared-buffer graph shares: the ONNX Runtime session and the shapes."""

    session: object                 # onnxruntime.InferenceSession
    past_names: tuple[str, ...]     # past_key_values.{i}.key/value, in layer order
    kv_heads: int
    head_dim: int
    dtype: type
    logits_size: int
    max_positions: int              # rows of the rotary tables: the most tokens a buffer may hold

    @property
    def present_names(self) -> tuple[str, ...]:
        return tuple(n.replace("past_key_values.", "present.", 1) for n in self.past_names)


class SharedKV:
    """The KV buffers of one session (none until the first feed), ``length`` of their rows holding tokens."""

    __slots__ = ("graph", "length", "capacity", "_arrays", "_values", "_feed", "_step", "_step_ids",
                 "_step_seqlens", "_step_total", "_step_logits", "_step_values")

    def __init__(self, graph: SharedKVGraph):
        self.graph = graph
        self.length = 0
        self.capacity = 0
        self._arrays: list[np.ndarray] = []
        self._values: list = []           # the OrtValues bound over _arrays (bindings do not keep them alive)
        self._feed = self._step = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays)

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` tokens (the rows after them are overwritten by the next feed)."""
        self.length = min(self.length, max(0, int(length)))

    def run(self, ids, keep: int = 1) -> np.ndarray:
        """Feeds ``ids`` after the held tokens; returns the logits [1, keep, logits_size] of the last ``keep``
        of them. A one-token, one-row result is the session's step buffer, overwritten by its next step."""
        n = len(ids)
        self._reserve(self.length + n)
        total = self.length + n
        if n == 1 and keep == 1:
            self._step_ids[0, 0] = ids[0]
            self._step_seqlens[0] = total - 1
            self._step_total[()] = total
            self.graph.session.run_with_iobinding(self._step)
            self.length = total
            return self._step_logits
        io = self._feed
        inputs = {"input_ids": np.asarray(ids, dtype=np.int64).reshape(1, n),      # alive until the run is done
                  "seqlens_k": np.array([total - 1], dtype=np.int32),
                  "total_sequence_length": np.array(total, dtype=np.int32),
                  "logits_to_keep": np.array([max(1, min(int(keep), n))], dtype=np.int64)}
        for name, array in inputs.items():
            io.bind_cpu_input(name, array)
        io.bind_output("logits")
        self.graph.session.run_with_iobinding(io)
        self.length = total
        return io.get_outputs()[0].numpy()

    def _reserve(self, rows: int) -> None:
        """Makes the buffers hold at least ``rows`` rows (a new, larger set with the held rows copied)."""
        if rows <= self.capacity:
            return
        import onnxruntime as ort

        g = self.graph
        grown = max(rows, 2 * self.capacity, CAPACITY_STEP)
        grown = -(-grown // CAPACITY_STEP) * CAPACITY_STEP
        capacity = max(rows, min(grown, g.max_positions)) if g.max_positions else grown
        arrays = [np.zeros((1, g.kv_heads, capacity, g.head_dim), g.dtype) for _ in g.past_names]
        for new, old in zip(arrays, self._arrays):
            new[:, :, :self.length] = old[:, :, :self.length]
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        if self._step is None:
            self._make_bindings()
        for io in (self._feed, self._step):
            for past, present, value in zip(g.past_names, g.present_names, values):
                io.bind_ortvalue_input(past, value)
                io.bind_ortvalue_output(present, value)
        self._arrays, self._values, self.capacity = arrays, values, capacity

    def _make_bindings(self) -> None:
        import onnxruntime as ort

        g = self.graph
        self._feed = g.session.io_binding()
        self._feed.bind_output("logits")                # first: get_outputs() lists outputs in binding order
        self._step = g.session.io_binding()
        self._step_ids = np.zeros((1, 1), np.int64)
        self._step_seqlens = np.zeros(1, np.int32)
        self._step_total = np.zeros((), np.int32)
        self._step_logits = np.zeros((1, 1, g.logits_size), np.float32)
        inputs = {"input_ids": self._step_ids, "seqlens_k": self._step_seqlens,
                  "total_sequence_length": self._step_total, "logits_to_keep": np.ones(1, np.int64)}
        self._step_values = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in inputs.items()}
        self._step_values["logits"] = ort.OrtValue.ortvalue_from_numpy(self._step_logits)
        for name, value in self._step_values.items():
            if name == "logits":
                self._step.bind_ortvalue_output(name, value)
            else:
                self._step.bind_ortvalue_input(name, value)
