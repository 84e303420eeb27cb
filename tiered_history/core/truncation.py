"""Head + tail truncation with a visible marker; the stored original is never touched."""

from __future__ import annotations

from .framing import TokenCounting as TokenCounter

#: The marker is part of the context so the model knows text is missing.
MARKER = "[truncated {n} chars]"
_HEAD_SHARE = 0.6  # openings carry the question, endings the latest detail: keep more head


def head_tail(text: str, max_chars: int) -> str | None:
    """Return ``text`` cut to about ``max_chars`` around a marker, or None if it already fits."""
    if len(text) <= max_chars:
        return None
    marker_room = len(MARKER.format(n=len(text))) + 2
    keep = max(max_chars - marker_room, 2)
    head = int(keep * _HEAD_SHARE)
    tail = keep - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n{MARKER.format(n=cut)}\n{text[len(text) - tail :] if tail else ''}"


def truncate_to_tokens(counter: TokenCounter, text: str, max_tokens: int) -> str:
    """Cut ``text`` head + tail so that ``counter.count`` of the result is at most ``max_tokens``.

    Used only for the newest message when it alone exceeds the budget: the one
    place where reading re-tokenises.
    """
    if counter.count(text) <= max_tokens:
        return text
    tokens = counter.encode(text)
    lo, hi = 0, len(tokens)
    best = ""
    # Binary search on how many tokens of the original to keep (head 60%, tail 40%).
    while lo <= hi:
        mid = (lo + hi) // 2
        head_n = int(mid * _HEAD_SHARE)
        tail_n = mid - head_n
        head = counter.decode(tokens[:head_n])
        tail = counter.decode(tokens[len(tokens) - tail_n :]) if tail_n else ""
        cut = len(text) - len(head) - len(tail)
        candidate = f"{head}\n{MARKER.format(n=max(cut, 0))}\n{tail}" if mid else MARKER.format(n=len(text))
        if counter.count(candidate) <= max_tokens:
            best = candidate
            lo = mid + 1
        else:
            hi = mid - 1
    return best
