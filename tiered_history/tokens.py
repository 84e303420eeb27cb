"""Token counting with the model's real tokenizer, OpenAI chat framing included.

tiktoken normally downloads its BPE files; many servers (and CI) cannot. litellm
ships cl100k_base, o200k_base and p50k_base, so unless the user has set
``TIKTOKEN_CACHE_DIR`` we point tiktoken at that copy. Only the file system is
touched: litellm itself is not imported here (it is slow to import).

Messages are counted the way the provider bills them, never below:

* string values (``content``, ``role``, ``name``, ``reasoning_content``...) with the tokenizer,
  3 tokens of framing per message and 1 more for a ``name``;
* ``content`` part lists part by part: text and refusal parts as text, images by OpenAI's
  published formula for the counter's model (see :class:`VisionRule`), audio and file parts at
  a configurable flat cost (their real cost depends on a length we cannot read cheaply);
* everything else -- ``tool_calls``, ``function_call``, ``thinking_blocks`` with their
  signatures, ``provider_specific_fields``, parts of unknown types -- as its compact JSON,
  which is at least what the provider renders for it.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import os
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .core.framing import REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE, TOKENS_PER_NAME
from .errors import ConfigurationError

if TYPE_CHECKING:
    import tiktoken

#: Share of the budget to leave free when the tokenizer is only an estimate (Claude, Llama,
#: Gemini... counted with cl100k_base): filling ``max_tokens * (1 - margin)`` stays within
#: ``max_tokens`` for counts up to 25% low. Measured: litellm's bundled Claude tokenizer gives
#: 1.00x cl100k_base on 47,003 English turns of the shared train splits (p99 of a single message
#: 1.20x) and 1.10x on this package's Python source; newer tokenizers (Claude 3+, not public)
#: are reported to run longer still, hence the headroom. Not for every script: that tokenizer
#: counts Thai at 1.74x, Vietnamese 1.41x, Greek 1.37x, Tamil 1.32x, Korean 1.28x (documented).
ESTIMATED_SAFETY_MARGIN: Final = 0.2
#: Cost of an image whose size we cannot read (an https URL: we never fetch) or whose model's
#: image formula we do not know. Covers Anthropic's standard tier (images are downscaled to
#: about 1,568 tokens), Gemini's 258 tokens per 768px tile for typical images and every OpenAI
#: tile model's largest high-detail image (gpt-4o: 1,445). Raise it for models that read
#: images at higher resolution.
DEFAULT_IMAGE_TOKENS: Final = 1600
#: Estimated cost of an ``input_audio`` part: about one minute at Gemini's documented 32 tokens
#: per second. An estimate, not a bound: long recordings cost more.
DEFAULT_AUDIO_TOKENS: Final = 2000
#: Estimated cost of a ``file`` part (a PDF is read as its text plus an image per page): a few
#: pages. An estimate, not a bound.
DEFAULT_FILE_TOKENS: Final = 4000

_SHIPPED = {"cl100k_base", "o200k_base", "p50k_base"}
_lock = threading.Lock()


def _point_tiktoken_at_litellm_copy() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "litellm_core_utils" / "tokenizers"
        if candidate.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(candidate)
            return


def _known_encoding(model: str) -> str | None:
    """The tiktoken encoding of ``model`` when tiktoken knows it exactly, else None."""
    import tiktoken  # here, not at the top: ``import tiered_history`` need not load it

    if model in tiktoken.list_encoding_names() or model in _SHIPPED:
        return model
    try:
        return tiktoken.encoding_name_for_model(model.split("/")[-1])
    except KeyError:
        return None


def encoding_name_for(model: str) -> str:
    """Map a model name (``gpt-4o``, ``openai/gpt-4o-mini``, ``cl100k_base``) to a tiktoken encoding."""
    # Non-OpenAI models (Claude, Llama, Gemini...): cl100k_base is the closest offline
    # approximation; TokenCounter.exact is then False and safety_margin applies.
    return _known_encoding(model) or "cl100k_base"


@lru_cache(maxsize=8)
def get_encoding(name: str) -> tiktoken.Encoding:
    import tiktoken

    with _lock:
        _point_tiktoken_at_litellm_copy()
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises bare requests/OSError when offline
            raise ConfigurationError(
                f"cannot load tiktoken encoding {name!r} (offline and not cached; "
                "set TIKTOKEN_CACHE_DIR to a directory holding it)"
            ) from exc


# -- images ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VisionRule:
    """How a model bills an image, from OpenAI's vision guide ("Calculating costs",
    https://platform.openai.com/docs/guides/images-vision#calculating-costs).

    Tile models: ``low`` costs ``base``; ``high`` (and ``auto``, counted as ``high`` to stay
    safe) scales the image to fit 2048x2048, then down so its shortest side is at most 768,
    and costs ``base + tile * (512px tiles covering it)``. Patch models: the image is covered by
    32x32 patches, capped at 1536, times ``multiplier`` (detail does not matter). ``flat``:
    the formula is unknown, every image costs the counter's ``image_tokens``.
    """

    kind: str  # "tile" | "patch" | "flat"
    base: int = 0
    tile: int = 0
    multiplier_percent: int = 0  # patch multiplier x 100, kept integral so rounding is exact

    def tokens(self, size: tuple[int, int] | None, detail: str, unknown: int | None, flat: int) -> int:
        """Cost of one image of ``size`` (None if unreadable); ``unknown`` overrides the bound."""
        if self.kind == "tile":
            if detail == "low":
                return self.base
            if size is None:
                # At most 768 x 2048 after scaling: 2 x 4 tiles.
                return unknown if unknown is not None else self.base + 8 * self.tile
            return self.base + self.tile * _tiles(*size)
        if self.kind == "patch":
            if size is not None:
                patches = min(_PATCH_CAP, _ceil_div(size[0], 32) * _ceil_div(size[1], 32))
            elif unknown is not None:
                return unknown
            else:
                patches = _PATCH_CAP
            return _ceil_div(patches * self.multiplier_percent, 100)
        return flat


_PATCH_CAP: Final = 1536
# Longest prefix first. Constants from OpenAI's vision guide (above), checked against billed
# usage for a 128x64 image reported at community.openai.com/t/1262691 (gpt-4o, gpt-4.1,
# gpt-4.5, gpt-4-turbo: 85 low / 255 high; gpt-4o-mini: 2833 / 8500; o3: 75 / 225; gpt-4.1-mini,
# gpt-4.1-nano, o4-mini: 8 patches x 1.62 / 2.46 / 1.72). gpt-5-mini / gpt-5-nano multipliers as
# listed in github.com/xn1cklas/tokenlens/issues/7 (patch models per openai-python#2851).
# Models not listed here (gpt-5 and later, Claude, Gemini...) cost DEFAULT_IMAGE_TOKENS.
_VISION_RULES: Final[tuple[tuple[str, VisionRule], ...]] = (
    ("gpt-4o-mini", VisionRule("tile", base=2833, tile=5667)),
    ("gpt-4.1-mini", VisionRule("patch", multiplier_percent=162)),
    ("gpt-4.1-nano", VisionRule("patch", multiplier_percent=246)),
    ("gpt-5-mini", VisionRule("patch", multiplier_percent=162)),
    ("gpt-5-nano", VisionRule("patch", multiplier_percent=246)),
    ("o4-mini", VisionRule("patch", multiplier_percent=172)),
    ("gpt-4o", VisionRule("tile", base=85, tile=170)),
    ("chatgpt-4o", VisionRule("tile", base=85, tile=170)),
    ("gpt-4.1", VisionRule("tile", base=85, tile=170)),
    ("gpt-4.5", VisionRule("tile", base=85, tile=170)),
    ("gpt-4-turbo", VisionRule("tile", base=85, tile=170)),
    ("gpt-4-vision", VisionRule("tile", base=85, tile=170)),
    ("o1", VisionRule("tile", base=75, tile=150)),
    ("o3", VisionRule("tile", base=75, tile=150)),
)
_FLAT: Final = VisionRule("flat")


def vision_rule_for(model: str) -> VisionRule:
    """The image billing rule of ``model`` (``openai/gpt-4o``, ``ft:gpt-4o-mini:...`` included)."""
    bare = model.split("/")[-1].lower()
    if bare.startswith("ft:"):
        bare = bare[3:]
    for prefix, rule in _VISION_RULES:
        if bare == prefix or bare.startswith(prefix + "-") or bare.startswith(prefix + ":"):
            return rule
    return _FLAT


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(width: int, height: int) -> int:
    """512px tiles of an image after OpenAI's high-detail scaling.

    Scaled sides are rounded up (OpenAI rounds to nearest), so the count is never below the bill.
    """
    longest = max(width, height)
    if longest > 2048:
        width, height = _ceil_div(width * 2048, longest), _ceil_div(height * 2048, longest)
    shortest = min(width, height)
    if shortest > 768:  # only ever scaled down: a 128x64 image is billed one tile
        width, height = _ceil_div(width * 768, shortest), _ceil_div(height * 768, shortest)
    return _ceil_div(width, 512) * _ceil_div(height, 512)


#: Base64 characters decoded to find an image's size: enough for a JPEG whose size marker
#: follows a large EXIF block, while a 20 MB data URL is never decoded whole.
_HEADER_CHARS: Final = 256 * 1024


def image_size(url: str) -> tuple[int, int] | None:
    """Width and height of a base64 ``data:`` URL's PNG, JPEG, GIF or WebP image, else None.

    Never fetches anything: an http(s) URL (or anything unreadable) gives None.
    """
    if not url.startswith("data:"):
        return None
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    chunk = "".join(data[: _HEADER_CHARS + 1024].split())[:_HEADER_CHARS]
    chunk = chunk[: len(chunk) - len(chunk) % 4]
    try:
        raw = base64.b64decode(chunk, validate=False)
    except (binascii.Error, ValueError):
        return None
    size = _png(raw) or _gif(raw) or _webp(raw) or _jpeg(raw)
    return size if size and size[0] > 0 and size[1] > 0 else None


def _png(b: bytes) -> tuple[int, int] | None:
    if b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR" and len(b) >= 24:
        w, h = struct.unpack(">II", b[16:24])
        return int(w), int(h)
    return None


def _gif(b: bytes) -> tuple[int, int] | None:
    if b[:6] in (b"GIF87a", b"GIF89a") and len(b) >= 10:
        w, h = struct.unpack("<HH", b[6:10])
        return int(w), int(h)
    return None


def _webp(b: bytes) -> tuple[int, int] | None:
    if b[:4] != b"RIFF" or b[8:12] != b"WEBP" or len(b) < 30:
        return None
    chunk = b[12:16]
    if chunk == b"VP8 " and b[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", b[26:30])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    if chunk == b"VP8L" and b[20] == 0x2F:
        bits = int.from_bytes(b[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(b[24:27], "little") + 1, int.from_bytes(b[27:30], "little") + 1
    return None


# Start-of-frame markers carry the size: every SOFn except DHT (C4), JPG (C8) and DAC (CC).
_SOF: Final = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(b: bytes) -> tuple[int, int] | None:
    if b[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(b):
        if b[i] != 0xFF:
            return None
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        length = int.from_bytes(b[i + 2 : i + 4], "big")
        if marker in _SOF and i + 9 <= len(b):
            h, w = struct.unpack(">HH", b[i + 5 : i + 9])
            return int(w), int(h)
        if length < 2:
            return None
        i += 2 + length
    return None


# -- the counter ----------------------------------------------------------------------------


class TokenCounter:
    """Counts tokens the way OpenAI's chat API bills them.

    ``exact`` is True when the model's own tokenizer is known (OpenAI models and tiktoken
    encoding names); otherwise counts are cl100k_base estimates and ``safety_margin`` is the
    share of a budget the engine should leave free. ``image_tokens`` is the cost of an image
    whose size cannot be read (default: the largest the model's formula allows, or
    :data:`DEFAULT_IMAGE_TOKENS` when the formula is unknown); ``audio_tokens`` and
    ``file_tokens`` price ``input_audio`` and ``file`` parts.
    """

    def __init__(
        self,
        model: str = "cl100k_base",
        *,
        image_tokens: int | None = None,
        audio_tokens: int = DEFAULT_AUDIO_TOKENS,
        file_tokens: int = DEFAULT_FILE_TOKENS,
    ) -> None:
        for what, value in (
            ("image_tokens", image_tokens),
            ("audio_tokens", audio_tokens),
            ("file_tokens", file_tokens),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigurationError(f"{what} must be a non-negative integer, not {value!r}")
        self.model = model
        known = _known_encoding(model)
        self.exact: bool = known is not None
        self.encoding_name: str = known or "cl100k_base"
        self.safety_margin: float = 0.0 if self.exact else ESTIMATED_SAFETY_MARGIN
        self.vision: VisionRule = vision_rule_for(model)
        self.image_tokens = image_tokens
        self.audio_tokens = audio_tokens
        self.file_tokens = file_tokens
        self._enc = get_encoding(self.encoding_name)
        self._short: dict[str, int] = {}
        self._lines: dict[str, int] = {}
        self._split_lines = self.encoding_name in _LINE_SPLIT_ENCODINGS

    def usable_budget(self, max_tokens: int) -> int:
        """What may be filled of ``max_tokens`` once the safety margin is set aside."""
        return int(max_tokens * (1.0 - self.safety_margin))

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= _SHORT:
            # Roles, names and ids recur in every message: the tokenizer call costs more than they do.
            found = self._short.get(text)
            if found is None:
                if len(self._short) >= 4096:
                    self._short.clear()
                found = self._short[text] = len(self._enc.encode(text, disallowed_special=()))
            return found
        return len(self._enc.encode(text, disallowed_special=()))

    def count_lines(self, text: str) -> int:
        """``count(text)``, as the sum of the counts of its lines, each remembered: a block or a
        recall note is measured whole on every read, and most of its lines (summaries) repeat.

        Exact: tiktoken cuts a text into pieces by its encoding's pattern and merges tokens only
        within a piece, and in every pattern of :data:`_LINE_SPLIT_ENCODINGS` a newline between
        two non-space characters (a letter or digit, or ASCII punctuation but ``/``) ends a piece
        and the next starts right after it: a letter or digit run, a digit group or a punctuation
        run stops at it; the newline goes with the punctuation before it (``[\\r\\n]*``, which
        ``/`` would extend in o200k) or is a piece of its own (``\\s*[\\r\\n]``, ``\\s``;
        ``\\s++$`` and ``\\s+(?!\\S)`` at the end of a line counted alone give the same
        piece). So the text is cut only there, and other encodings are counted whole."""
        if not self._split_lines or len(text) <= _SHORT:
            return self.count(text)
        parts = text.split("\n")
        if len(parts) == 1:
            return self.count(text)
        lines, start = [], 0
        for k in range(len(parts) - 1):
            before, after = parts[k], parts[k + 1]
            if before and after:
                a, b = before[-1], after[0]
                if (a.isalnum() or a in _EDGE) and (b.isalnum() or b in _EDGE):
                    lines.append("\n".join(parts[start : k + 1]) + "\n")
                    start = k + 1
        lines.append("\n".join(parts[start:]))
        total, memo = 0, self._lines
        for line in lines:
            found = memo.get(line)
            if found is None:
                if len(memo) >= _LINES:
                    memo.clear()
                found = memo[line] = self.count(line)
            total += found
        return total

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def image_cost(self, url: str, detail: str = "auto") -> int:
        """Tokens of one image part (``detail`` ``auto`` and unknown values count as ``high``)."""
        flat = DEFAULT_IMAGE_TOKENS if self.image_tokens is None else self.image_tokens
        return self.vision.tokens(image_size(url), detail, self.image_tokens, flat)

    def part_tokens(self, part: object) -> int:
        """Tokens of one content part."""
        if isinstance(part, str):  # litellm accepts bare strings in a part list
            return self.count(part)
        if not isinstance(part, Mapping):
            return self._json_tokens(part)
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return self.count(part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self.count(part["refusal"])
        if kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail") if isinstance(image, Mapping) else None
            if isinstance(url, str):
                return self.image_cost(url, detail if isinstance(detail, str) else "auto")
        if kind == "input_audio":
            return self.audio_tokens
        if kind == "file":
            return self.file_tokens
        return self._json_tokens(part)

    def content_tokens(self, content: object) -> int:
        """Tokens of a message's ``content``: a string, None or a list of parts."""
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count(content)
        if isinstance(content, list | tuple):
            return sum(self.part_tokens(p) for p in content)
        return self._json_tokens(content)

    def _json_tokens(self, value: object) -> int:
        return self.count(json.dumps(value, separators=(",", ":"), default=str))

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        """Framed cost of one chat message dict (without the reply priming)."""
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if value is None:
                continue
            if isinstance(value, str):
                total += self.count(value)
            elif key == "content":
                total += self.content_tokens(value)
            elif key == "audio" and isinstance(value, Mapping) and "data" in value:
                # A spoken reply is heard again as audio, not read as its base64 text.
                total += self.audio_tokens + self._json_tokens(
                    {k: v for k, v in value.items() if k != "data"}
                )
            else:
                total += self._json_tokens(value)
            if key == "name":
                total += TOKENS_PER_NAME
        return total

    def messages_tokens(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Framed cost of a whole request: every message plus the reply priming."""
        return REPLY_PRIMING_TOKENS + sum(self.message_tokens(m) for m in messages)


#: Texts up to this many characters have their counts remembered (see ``TokenCounter.count``).
_SHORT = 16

#: Encodings whose pattern (r50k/p50k, cl100k, o200k) ends a piece at a newline between two
#: :data:`_EDGE` characters (see ``TokenCounter.count_lines``).
_LINE_SPLIT_ENCODINGS = frozenset({"r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base"})
#: Characters that are never whitespace in any pattern (ASCII punctuation; letters and digits are
#: checked with ``str.isalnum``). ``/`` is left out: o200k keeps a newline and the slashes after it
#: in one piece.
_EDGE = frozenset("!\"#$%&'()*+,-.:;<=>?@[\\]^_`{|}~")
#: Lines whose counts a counter remembers (a block or a recall note repeats most of its lines).
_LINES = 2048


@lru_cache(maxsize=8)
def counter_for_encoding(encoding: str) -> TokenCounter:
    """A counter for a conversation's stored ``encoding``: counts written to a conversation are
    always in the encoding it was created with, whichever ``model`` the writing worker has."""
    return TokenCounter(encoding)
