"""OpenAI-compatible request parsing and the pieces of a reply: no HTTP, no engine calls.

``parse_chat`` / ``parse_completion`` turn a JSON body into a ``Parsed`` request (or raise ``ApiError``
with OpenAI's error shape); ``StopCutter`` cuts the text at the first stop string, also across stream
chunks; ``PieceCutter`` does the same over per-token pieces (each token's text and origin: draft, lookup,
target) for the ``tandem`` extension.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.types import SamplingParams

MAX_STOP_STRINGS = 4            # as OpenAI


class ApiError(Exception):
    """An error for the client in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class Parsed:
    """One client request in the engine's terms (plus what only the HTTP side needs)."""

    chat: bool
    messages: list[dict] = field(default_factory=list)   # chat: [{"role", "content": str}]
    prompt: str = ""                                     # completions: a string ...
    prompt_ids: tuple[int, ...] = ()                     # ... or token ids
    max_tokens: int | None = None                        # None: as many as the context allows
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    no_speculation: bool = False
    draft_length: int = 0
    draft_confidence: float | None = None
    ignore_eos: bool = False
    echo: bool = False
    model: str | None = None
    cache_salt: str = ""                                 # the verifier's prefix cache, shared within one salt


# Accepted only with their "no-op" value: anything else is refused rather than silently ignored.
_NEUTRAL = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "best_of": (1,),
    "store": (False,),
    "parallel_tool_calls": (False, True),
    "suffix": ("",),
}
_IGNORED = {"user", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream", "stream_options",
           "tandem", "no_speculation", "ignore_eos", "cache_salt"}
CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "response_format", "logit_bias", "tools",
                       "tool_choice"} | set(_NEUTRAL) | _IGNORED
COMPLETION_KEYS = _COMMON | {"prompt", "echo", "logit_bias"} | set(_NEUTRAL) | _IGNORED
TANDEM_KEYS = {"speculation", "draft_length", "draft_confidence", "ignore_eos"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _int(body: dict, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise bad(f"'{key}' must be an integer, got {v!r}", key, "invalid_type")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad(f"'{key}' must be {rng}, got {v}", key)
    return v


def _number(body: dict, key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_number(v):
        raise bad(f"'{key}' must be a number, got {v!r}", key, "invalid_type")
    return float(v)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be a boolean, got {v!r}", key, "invalid_type")
    return v


def _check_keys(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise bad(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    for key, neutral in _NEUTRAL.items():
        v = body.get(key)
        if v is not None and not (v in neutral and type(v) in {type(n) for n in neutral}):
            raise bad(f"'{key}' = {v!r} is not supported by this server", key, "unsupported_value")
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by this server", "logit_bias", "unsupported_value")


def _common(body: dict, parsed: Parsed) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {model!r}", "model", "invalid_type")
    parsed.model = model
    n = _int(body, "n")
    if n is not None and n != 1:
        raise bad(f"only n = 1 is supported, got n = {n}", "n", "unsupported_value")
    temperature = _number(body, "temperature")
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise bad(f"'temperature' must be between 0 and 2 (0 = greedy), got {temperature}", "temperature")
    top_p = _number(body, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise bad(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = _int(body, "top_k", -1, 2**31 - 1)
    seed = _int(body, "seed", 0, 2**64 - 1)
    # Defaults as OpenAI's: temperature 1 and top_p 1 when not given.
    parsed.sampling = SamplingParams(temperature=1.0 if temperature is None else temperature,
                                     top_k=0 if top_k in (None, -1) else top_k,
                                     top_p=1.0 if top_p is None else top_p, seed=seed)
    try:
        parsed.sampling.validate()      # the domain's own bounds (e.g. no temperature between 0 and 1e-4)
    except ValueError as exc:
        raise bad(str(exc), getattr(exc, "param", None)) from None
    parsed.stop = _stop(body.get("stop"))
    parsed.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad("'stream_options' must be an object", "stream_options", "invalid_type")
        if not parsed.stream:
            raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        for key in options:
            if key not in ("include_usage", "include_obfuscation"):
                raise bad(f"Unrecognized stream option: {key}", f"stream_options.{key}", "unknown_parameter")
        parsed.include_usage = _bool(options, "include_usage")
    parsed.no_speculation = _bool(body, "no_speculation")
    parsed.ignore_eos = _bool(body, "ignore_eos")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or len(salt) > 256):
        raise bad("'cache_salt' must be a string of at most 256 characters", "cache_salt", "invalid_type")
    parsed.cache_salt = salt or ""
    ext = body.get("tandem")
    if ext is not None:
        if not isinstance(ext, dict):
            raise bad("'tandem' must be an object", "tandem", "invalid_type")
        for key in ext:
            if key not in TANDEM_KEYS:
                raise bad(f"Unrecognized tandem option: {key} (known: {', '.join(sorted(TANDEM_KEYS))})",
                          f"tandem.{key}", "unknown_parameter")
        if ext.get("speculation") is not None:
            if not isinstance(ext["speculation"], bool):
                raise bad("'tandem.speculation' must be a boolean", "tandem.speculation", "invalid_type")
            parsed.no_speculation = parsed.no_speculation or not ext["speculation"]
        parsed.draft_length = _int(ext, "draft_length", 0) or 0
        confidence = _number(ext, "draft_confidence")
        parsed.draft_confidence = confidence
        parsed.ignore_eos = parsed.ignore_eos or _bool(ext, "ignore_eos")


def _unpaired_surrogate(body) -> tuple[str, int] | None:
    """The first string in a parsed JSON body that is not Unicode text: (its path, the index of its unpaired
    UTF-16 surrogate, which JSON's \\ud800 escapes allow and no UTF-8 encoder or tokenizer takes), or None.
    Walked with a stack of its own, so a deeply nested body costs no recursion."""
    todo = [("", body)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return path, exc.start
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            todo.extend(reversed([((f"{path}.{key}" if path else key) if isinstance(key, str) else f"{path}[{key}]", item)
                                  for key, item in items]))
    return None


def _check_text(body: dict) -> None:
    """Every string of the body is Unicode text (a lone surrogate would otherwise fail in the tokenizer)."""
    found = _unpaired_surrogate(body)
    if found is not None:
        path, at = found
        raise bad(f"{path}: an unpaired UTF-16 surrogate at character {at} is not Unicode text; send each "
                  "character outside the Basic Multilingual Plane as a surrogate pair (or as UTF-8)", path)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(items) > MAX_STOP_STRINGS:
        raise bad(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(items)}", "stop")
    return tuple(s for s in items if s)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]: only text parts are supported",
                          f"messages[{i}].content", "unsupported_value")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content",
              "invalid_type")


def parse_chat(body) -> Parsed:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    _check_keys(body, CHAT_KEYS)
    _check_text(body)
    for key in ("tools", "tool_choice"):
        if body.get(key) not in (None, [], "none"):
            raise bad(f"'{key}' is not supported by this server", key, "unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("only response_format {\"type\": \"text\"} is supported", "response_format", "unsupported_value")
    parsed = Parsed(chat=True)
    _common(body, parsed)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages", "invalid_type" if messages else "missing")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise bad(f"messages[{i}].role {role!r} is not supported (system, developer, user, assistant)",
                      f"messages[{i}].role", "unsupported_value")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise bad(f"messages[{i}]: unsupported fields {sorted(extra)}", f"messages[{i}]", "unknown_parameter")
        parsed.messages.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    a, b = _int(body, "max_tokens", 1), _int(body, "max_completion_tokens", 1)
    if a is not None and b is not None and a != b:
        raise bad("give either 'max_tokens' or 'max_completion_tokens'", "max_completion_tokens")
    parsed.max_tokens = b if b is not None else a
    return parsed


def parse_completion(body) -> Parsed:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    _check_keys(body, COMPLETION_KEYS)
    _check_text(body)
    parsed = Parsed(chat=False)
    _common(body, parsed)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]              # one prompt in a batch of one
    if isinstance(prompt, str):
        if not prompt.strip():
            raise bad("the prompt is empty", "prompt")
        parsed.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        parsed.prompt_ids = tuple(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad("only one prompt per request is supported", "prompt", "unsupported_value")
    else:
        raise bad("'prompt' must be a string or a list of token ids", "prompt", "invalid_type" if prompt else "missing")
    parsed.echo = _bool(body, "echo")
    parsed.max_tokens = _int(body, "max_tokens", 1)
    if parsed.max_tokens is None:
        parsed.max_tokens = 16          # OpenAI's default for completions
    return parsed


class StopCutter:
    """Cuts generated text at the first occurrence of any stop string, even when it spans chunks.

    ``feed(text)`` returns the text that may go out now: it holds back a tail that could be the start of
    a stop string. Once a stop string is found, ``stopped`` is True and nothing more goes out.
    ``flush()`` releases what was held when the generation ends without a stop.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:n]):
                    hold = n
                    break
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


class PieceCutter:
    """A StopCutter over per-token pieces: what goes out is always a list of pieces whose texts add up to
    the text that goes out (a piece cut by a stop string or held back in part is split)."""

    def __init__(self, stops: Sequence[str]):
        self.cutter = StopCutter(stops)
        self.queue: list[dict] = []

    @property
    def stopped(self) -> bool:
        return self.cutter.stopped

    def _take(self, n: int) -> list[dict]:
        out = []
        while self.queue and (n > 0 or self.queue[0]["text"] == ""):
            piece = self.queue[0]
            if len(piece["text"]) <= n:
                out.append(self.queue.pop(0))
                n -= len(piece["text"])
            else:
                out.append({**piece, "text": piece["text"][:n]})
                self.queue[0] = {**piece, "text": piece["text"][n:], "continued": True}
                n = 0
        return out

    def feed(self, pieces: list[dict]) -> tuple[str, list[dict]]:
        if self.cutter.stopped:
            return "", []
        self.queue.extend(pieces)
        text = self.cutter.feed("".join(p["text"] for p in pieces))
        out = self._take(len(text))
        if self.cutter.stopped:
            self.queue.clear()
        return text, out

    def flush(self) -> tuple[str, list[dict]]:
        text = self.cutter.flush()
        out = self._take(len(text)) + [p for p in self.queue if p["text"] == ""]
        self.queue.clear()
        return text, out
