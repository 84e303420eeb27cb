"""Context assembly: choose what fits in ``max_tokens`` from rows already read. No I/O.

The context is laid out stable-first, so a provider's prompt cache keeps hitting:

    pinned → archives (one block) → topic summaries (one block) → current topic (verbatim)
           … recalled messages, just before the newest user message … newest user message

* **The current topic** is every message from a *window start* on, verbatim. The start only
  moves at *anchors*: the first unit at or past each multiple of ``anchor`` × the budget in
  the conversation's token positions. It is the earliest anchor whose window, with the stable
  blocks and its growth room or the recall reserve (whichever is larger), fits; so it stays put
  turn after turn while the conversation grows, and jumps by a chunk when it must, like "append
  until full, then drop the oldest half".
* **Topic summaries** cover what came before the window start: the newest and largest ones
  first within the topic share (less its recall reserve), shown oldest first. When the window
  moves, the summaries shown so far stay and those of what it left are appended, so the blocks
  stay a cached prefix; room the new start leaves beyond the growth room goes to more summaries.
  A moved window shows first the summaries no archive holds yet (what windows left since the
  last merge), in the room the archives leave, so what it left is not missing until it moves
  again (as far as that room holds them).
* **Archives** (merged summaries, rolled up into coarser ones as they grow) cover the oldest
  parts: the whole timeline stays represented. Room still left then shows the newest archive
  as what it was made of (:func:`unroll`: the archives a roll-up rolled up, the topic summaries
  an archive merged), newest first: the past nearest the present at a finer resolution. A
  window may start inside an archive whose parts are read, where one of them ends: the parts
  before the start are shown in the archive's place (a conversation a little past its budget
  keeps its newest topics word for word rather than as the archive they were merged into).
* **Recall** uses what is left, up to its reserve (which the current topic may grow into
  between events: recall is sent uncached anyway, a moved window is not): the messages (whole
  tool units) and summaries that best match the newest message, as earlier conversation, after
  a note that says so. It sits at the end, so a new recall costs only its own tokens.

Every item's cost is its exact framed cost, and each block is measured whole, so the total never
exceeds ``max_tokens``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache
from itertools import accumulate, pairwise

from ..errors import BudgetTooSmallError
from ..models import CompressedContext, StoredMessage, Summary
from .budget import Allocation, allocate, check_max_tokens, summary_shares
from .excerpt import matching_sentences
from .framing import REPLY_PRIMING_TOKENS
from .framing import TokenCounting as TokenCounter
from .ranking import occurrences, query_words, recall_terms
from .render import day_lines, item_line, recall_note, render_block
from .state import WindowMark
from .truncation import MARKER, truncate_to_tokens
from .units import RESULT_ROLES, group_units, in_unit

Measure = Callable[[str], int]
"""Framed tokens of a user message with this content (the caller may memoise it)."""


@dataclass(frozen=True, slots=True)
class Shares:
    current: float
    topics: float
    bulk: float
    redistribute: bool = True
    recall: float = 0.4
    """Share of the topic tier kept for what is recalled for the newest message."""
    anchor: float = 0.25
    """The window start moves in steps of about this share of the budget."""
    cache_min: int = 2048
    """Below this budget the layout is chosen for relevance alone: providers do not cache prompts
    that short (OpenAI from 1,024 tokens, Anthropic and Gemini from 1,024 to 4,096 by model)."""

    def at(self, max_tokens: int) -> Shares:
        """The shares a context of ``max_tokens`` is laid out with (see :func:`~.budget.summary_shares`)."""
        topics, bulk, recall = summary_shares(
            self.topics, self.bulk, self.recall, max_tokens, self.cache_min, self.redistribute
        )
        if (topics, bulk, recall) == (self.topics, self.bulk, self.recall):
            return self
        return replace(self, topics=topics, bulk=bulk, recall=recall)


@dataclass(frozen=True, slots=True)
class Recalled:
    """A candidate for recall: a whole unit of messages, or a summary, and how well it matches."""

    score: float
    messages: tuple[StoredMessage, ...] = ()
    summary: Summary | None = None

    @property
    def first(self) -> int:
        return self.messages[0].sequence if self.messages else self.summary.first_sequence  # type: ignore[union-attr]

    @property
    def last(self) -> int:
        return self.messages[-1].sequence if self.messages else self.summary.last_sequence  # type: ignore[union-attr]

    @property
    def plain(self) -> StoredMessage | None:
        """Its message, if it is a single message that is neither a tool call nor a result (a
        unit is never cut: only such a message may be shown as an excerpt)."""
        if self.summary is not None or len(self.messages) != 1:
            return None
        m = self.messages[0]
        return None if in_unit(m) else m


#: A newest message giving recall fewer words than this ("nice", "Budget?", "thanks Anna") is a weak
#: query: matches of one word are noise as often as not. In a short context it is still recalled
#: for, but only within its reserve, not in place of the summaries of the whole timeline.
STRONG_QUERY_WORDS = 2


#: A newest message at least this share of whose recall words the window already holds (in the
#: messages before it) goes on with the conversation in the window rather than back to an earlier
#: one: a weak query too. A question about the past brings words the present does not hold.
CONTINUES_SHARE = 0.5


def _first_recall(rows: Rows, window: Sequence[StoredMessage], reserve: int) -> int | None:
    """How much room recall's first pass may take in a short context: ``None`` for as much as
    is free; ``reserve`` for a weak query (too few words, see :data:`STRONG_QUERY_WORDS`, or
    mostly words the ``window`` holds already, see :data:`CONTINUES_SHARE`); none at all once
    the message has been answered (the newest message is an assistant's reply calling no tool:
    the next turn is not that message's answer). Room nothing else takes still goes to recall.
    A query the caller gave is taken as meant."""
    if not rows.query or rows.explicit:
        return None
    newest = rows.recent[-1] if rows.recent else None
    if newest is not None and newest.role == "assistant" and not newest.tool_calls:
        return 0
    if query_words(rows.query) < STRONG_QUERY_WORDS or _continues(rows.query, window):
        return reserve
    return None


def _continues(query: str, window: Sequence[StoredMessage]) -> bool:
    """Whether at least :data:`CONTINUES_SHARE` of the recall words of ``query`` (the newest user
    message) occur in the ``window``'s messages other than that one."""
    terms = recall_terms(query)
    if not terms:
        return False
    rest = list(window)
    for i in range(len(rest) - 1, -1, -1):  # the query is the newest user message: not counted
        if rest[i].role == "user" and rest[i].content == query:
            del rest[i]
            break
    # Each word looked up in the window's text (lower-cased once), not the text split into words.
    count = occurrences("\n".join([m.content for m in rest]))
    held = sum(1 for t in terms if count((t,)))
    return held >= CONTINUES_SHARE * len(terms)


#: A sealed topic holding at least this share of what recall found (its messages' and its
#: summary's scores) is the one the newest message goes back to.
RETURN_SHARE = 0.5


def returned_topic(candidates: Sequence[Recalled], topics: Sequence[Summary]) -> tuple[Summary, float] | None:
    """The sealed topic the newest message goes back to, with its strength, if one stands out.

    A topic's strength is the sum of the scores of the candidates inside its range (matching
    messages, and its own summary). It stands out with at least two of them and at least
    :data:`RETURN_SHARE` of all candidates' strength: then its messages, verbatim, are recalled
    first when they fit (the swap-back), its summary or best messages when they do not."""
    total = sum(c.score for c in candidates)
    if total <= 0 or not topics:
        return None
    ordered = sorted(topics, key=lambda t: t.first_sequence)  # topics never overlap
    strength: dict[int, float] = {}
    inside: dict[int, int] = {}
    for c in candidates:
        i = bisect_right(ordered, c.first, key=lambda t: t.first_sequence) - 1
        if i >= 0 and c.last <= ordered[i].last_sequence:
            strength[i] = strength.get(i, 0.0) + c.score
            inside[i] = inside.get(i, 0) + 1
    top = max(strength, key=lambda k: strength[k], default=None)
    if top is None or inside[top] < 2 or strength[top] < RETURN_SHARE * total:
        return None
    return ordered[top], strength[top]


@dataclass(frozen=True, slots=True)
class Rows:
    """Everything assembly may use, read in one snapshot."""

    pinned: Sequence[StoredMessage]
    recent: Sequence[StoredMessage]
    """Unpinned messages, oldest first, up to the newest: the window is a suffix of them."""
    end_position: int
    """Tokens of every unpinned message so far (the newest one's end position)."""
    topics: Sequence[Summary] = ()
    """Live topic summaries with text, oldest first."""
    archives: Sequence[Summary] = ()
    """Live archives with text, oldest first."""
    recall: Sequence[Recalled] = ()
    uncovered: int = 0
    """Unpinned messages not yet represented by a summary (for reporting omissions)."""
    summarized_upto: int = 0
    query: str = ""
    explicit: bool = False
    """``query`` was given by the caller (``get_context(query=...)``): recalled for however short."""
    mark: WindowMark | None = None
    """Where the window started when it was last chosen."""
    epoch: int = 0
    """The conversation's event count now: the window may move only when it differs from the mark's."""
    growth: int = 0
    """How much the open topic may still grow before a rule seals it (an event): the room a window
    chosen now leaves, so that it need not move before then."""
    frozen: Sequence[Summary] = ()
    """The summaries the mark says were shown (read by id, whatever became of them since)."""
    finer: Sequence[Summary] = ()
    """Summaries and archives merged into the newest archives (what they were made of), if read:
    a context with room to spare shows them in an archive's place."""


def _cost(unit: Sequence[StoredMessage]) -> int:
    return unit[0].token_count if len(unit) == 1 else sum(m.token_count for m in unit)


def _plain(m: StoredMessage) -> bool:
    """Whether ``m``'s content is its text as it is sent (a string, or none), not content parts."""
    return not m.extra or not isinstance(m.extra.get("content"), list)


def fit_unit(counter: TokenCounter, unit: list[StoredMessage], limit: int) -> list[StoredMessage]:
    """Truncate the contents of ``unit`` head + tail until its framed cost is at most ``limit``."""
    fixed = [counter.message_tokens(m.to_openai(content="")) for m in unit]
    lengths = [max(m.token_count - f, 0) for m, f in zip(unit, fixed, strict=True)]
    content_budget = limit - sum(fixed)
    marker_cost = counter.count(MARKER.format(n=10**9)) + 2
    if content_budget < marker_cost * len(unit):
        raise BudgetTooSmallError(
            f"max_tokens leaves {limit} tokens for the newest message, which needs at least "
            f"{sum(fixed) + marker_cost * len(unit)} even when truncated"
        )
    total = sum(lengths) or 1
    for _ in range(8):  # re-tokenising may shift counts by a token or two; shrink until it fits
        out = []
        for m, n in zip(unit, lengths, strict=True):
            share = max(int(content_budget * n / total), marker_cost)
            text = truncate_to_tokens(counter, m.context_content, share)
            tokens = counter.message_tokens(m.to_openai(content=text))
            if text == m.context_content and (_plain(m) or m.token_count <= tokens):
                # Within its share: sent as it was (a tool call's None content, text parts),
                # unless parts cost more than their text (an image: then sent as its text).
                out.append(m)
                continue
            out.append(replace(m, truncated_content=text, token_count=tokens))
        if _cost(out) <= limit:
            return out
        content_budget -= _cost(out) - limit
    raise BudgetTooSmallError(f"could not fit the newest message into {limit} tokens")


# -- the stable blocks -----------------------------------------------------------------------------


def _line(s: Summary) -> str:
    return item_line(s.content, s.started_at, s.ended_at)


@dataclass
class _Block:
    tier: str
    items: list[Summary] = field(default_factory=list)
    tokens: int = 0

    def text(self) -> str:
        items = sorted(self.items, key=lambda s: s.first_sequence)
        return render_block(self.tier, day_lines([(s.content, s.started_at) for s in items]))


#: More than an item's own date line costs with its line break (25 for ``[2026-01-05 23:50 –
#: 2026-01-06 00:10 UTC]``): what its stored cost may exceed its share of a block by.
DATE_LINE_TOKENS = 28


def _overhead(tier: str, measure: Measure) -> int:
    return measure(render_block(tier, []))


def _fill(tier: str, ranked: Sequence[Summary], limit: int, measure: Measure) -> _Block:
    """The best of ``ranked`` that fit ``limit`` tokens as one block (measured exactly)."""
    block = _Block(tier)
    if not ranked or limit <= 0:
        return block
    estimate = _overhead(tier, measure)
    for s in ranked:
        if estimate + s.token_count <= limit:
            block.items.append(s)
            estimate += s.token_count
    while block.items:
        block.tokens = measure(block.text())
        if block.tokens <= limit:
            break
        block.items.pop()  # estimates were a little short: the least wanted item goes
    else:
        block.tokens = 0
    # An item's stored cost counts a date line of its own; in a block a day's items share one,
    # so items the estimate left out may fit still: tried in turn, each block measured exactly.
    chosen = {s.id for s in block.items}
    for s in ranked:
        if s.id in chosen or block.tokens + s.token_count - DATE_LINE_TOKENS > limit:
            continue
        trial = _Block(tier, [*block.items, s])
        trial.tokens = measure(trial.text())
        if trial.tokens <= limit:
            block = trial
            chosen.add(s.id)
    return block


def _made_of(finer: Sequence[Summary]) -> dict[int, list[Summary]]:
    """The summaries and archives read as parts, by the archive they were merged into, oldest first."""
    made_of: dict[int, list[Summary]] = {}
    for x in sorted(finer, key=lambda x: x.first_sequence):
        if x.merged_into is not None:
            made_of.setdefault(x.merged_into, []).append(x)
    return made_of


def _pieces(archives: Sequence[Summary], finer: Sequence[Summary]) -> dict[int, list[Summary]]:
    """Each archive's finest parts at hand (oldest first), for the archives whose parts, and
    their parts in turn while they are all at hand, cover its whole range; the others have none."""
    made_of = _made_of(finer)

    def finest(a: Summary) -> list[Summary]:
        parts = made_of.get(a.id, [])
        if not _tiles(a, parts):
            return [a]
        return [y for x in parts for y in finest(x)]

    out: dict[int, list[Summary]] = {}
    for a in archives:
        parts = finest(a)
        if parts != [a]:
            out[a.id] = parts
    return out


def _tiles(parent: Summary, children: Sequence[Summary]) -> bool:
    """Whether ``children`` (oldest first) cover exactly ``parent``'s range, with no gap."""
    if not children or children[0].first_sequence != parent.first_sequence:
        return False
    if children[-1].last_sequence != parent.last_sequence:
        return False
    return all(b.first_sequence == a.last_sequence + 1 for a, b in pairwise(children))


def unroll(
    archives: _Block, topics: _Block, finer: Sequence[Summary], room: int, measure: Measure
) -> tuple[_Block, _Block]:
    """The blocks with the newest archive shown as what it was made of, as long as both fit ``room``.

    Progressive compression in reverse, newest first: a roll-up gives way to the archives it
    rolled up, an archive to the topic summaries it merged (they join the topic block), so the
    room a context has left holds the part nearest the present at a finer resolution and the
    rest as it was; the blocks stay in time order. Only an archive whose parts are all at
    hand and cover its whole range is unrolled (parts with no text, topics of pinned messages
    only, count as covered: pinned messages are sent anyway).
    """
    parts = _made_of(finer)
    while archives.items:
        newest = max(archives.items, key=lambda a: a.last_sequence)
        made_of = parts.get(newest.id, [])
        if not _tiles(newest, made_of):
            break
        shown = [x for x in made_of if x.content]
        bulk = _Block("bulk", [a for a in archives.items if a.id != newest.id])
        bulk.items += [x for x in shown if x.tier != "topic"]
        topic = _Block("topic", [*topics.items, *(x for x in shown if x.tier == "topic")])
        bulk.tokens = measure(bulk.text()) if bulk.items else 0
        topic.tokens = measure(topic.text()) if topic.items else 0
        if bulk.tokens + topic.tokens > room:
            break
        archives, topics = bulk, topic
    return archives, topics


def _topic_priority(eligible: Sequence[Summary]) -> list[Summary]:
    """Topic summaries, most wanted first: newer ones, and among near ones the larger topics.

    Score = 0.85 ** (newer eligible topics) * (1 + ln(1 + source_tokens / 500)): recency
    dominates, but a long topic holds its place against a short, more recent one.
    """
    n = len(eligible)
    scored = [
        (0.85 ** (n - 1 - i) * (1 + math.log1p(s.source_tokens / 500)), i, s) for i, s in enumerate(eligible)
    ]
    scored.sort(key=lambda x: (-x[0], -x[1]))
    return [s for _, _, s in scored]


# -- assembly -------------------------------------------------------------------------------------


def assemble(
    *,
    conversation_id: str,
    max_tokens: int,
    shares: Shares,
    counter: TokenCounter,
    rows: Rows,
    measure: Measure | None = None,
) -> CompressedContext:
    """The context for ``rows`` within ``max_tokens`` (see the module docstring)."""
    check_max_tokens(max_tokens)
    if measure is None:

        def measure(text: str) -> int:
            return counter.message_tokens({"role": "user", "content": text})

    used = REPLY_PRIMING_TOKENS
    pinned = list(rows.pinned)
    pinned_cost = sum(m.token_count for m in pinned)
    if used + pinned_cost > max_tokens:
        biggest = max(pinned, key=lambda m: m.token_count)
        raise BudgetTooSmallError(
            f"max_tokens={max_tokens} cannot hold the pinned messages ({pinned_cost} tokens; the "
            f"largest, #{biggest.sequence} pinned as {biggest.pin_key!r}, alone {biggest.token_count}): "
            "pinned messages are never cut"
        )
    used += pinned_cost
    avail = max_tokens - used
    alloc = allocate(avail, shares.current, shares.topics, shares.bulk)  # what the context reports
    # A weak query's recall room in a short context: the configured reserve, which the window
    # gives up there (the archives hold the topic tier's whole share: see summary_shares).
    short_reserve = int(alloc.topics * shares.recall)
    laid = shares.at(max_tokens)
    # What the tiers hold: the same unless the archives hold part of the topic tier's room.
    held = alloc if laid is shares else allocate(avail, laid.current, laid.topics, laid.bulk)
    shares = laid
    units = group_units(rows.recent)

    if not units:
        return _context(
            conversation_id,
            max_tokens,
            alloc,
            pinned,
            _Block("bulk"),
            _Block("topic"),
            [],
            [],
            "",
            0,
            rows,
            used,
            False,
        )
    newest = units[-1]
    if _cost(newest) > avail:
        try:
            cut = fit_unit(counter, list(newest), avail)
        except BudgetTooSmallError:
            if not pinned or pinned[-1].sequence < newest[-1].sequence:
                raise
            # The newest message is a pinned instruction: the pinned messages alone are a context.
            cut, newest = [], []
        return _context(
            conversation_id,
            max_tokens,
            alloc,
            pinned,
            _Block("bulk"),
            _Block("topic"),
            [cut],
            [],
            "",
            0,
            rows,
            used,
            bool(cut),
        )

    # Kept whether or not this turn recalls anything, so the window does not move with the query.
    reserve = int(held.topics * shares.recall)
    bulk_limit = held.bulk
    topic_limit = held.topics - reserve
    all_archives = _fill("bulk", list(reversed(rows.archives)), bulk_limit, measure)

    # suffix[i]: the cost of units i on (summed in C: a window is a few hundred units).
    costs: list[int]
    if len(units) == len(rows.recent):  # a unit per message (no tool unit): its own cost
        costs = [m.token_count for m in rows.recent]
    else:
        costs = [u[0].token_count if len(u) == 1 else _cost(u) for u in units]
    suffix = list(accumulate(reversed(costs), initial=0))[::-1]

    cacheable = max_tokens >= shares.cache_min
    # An archive whose parts are at hand stands for them where a window starts inside it (laid
    # out for the cache: the short layout swaps parts back for messages itself): the window may
    # start where one part ends, the parts before it shown in the archive's place. A conversation
    # a little past its budget then keeps its newest topics word for word, not as the archive
    # they were merged into.
    pieces = _pieces(rows.archives, rows.finer) if cacheable else {}

    # A window starts at a summarised range's first message or after its last: never inside one,
    # where the summary and the messages it covers would both be sent, or neither.
    ranges = [(x.first_sequence, x.last_sequence) for x in (*rows.topics, *rows.archives)]
    fine = [(x.first_sequence, x.last_sequence) for xs in pieces.values() for x in xs]

    def split(i: int) -> list[Summary]:
        """The parts shown before unit ``i`` of the archive it starts inside (oldest first)."""
        first = units[i][0].sequence
        return [
            x
            for a in rows.archives
            if a.first_sequence < first <= a.last_sequence
            for x in pieces.get(a.id, ())
            if x.last_sequence < first and x.content
        ]

    def aligned(i: int) -> bool:
        first = units[i][0].sequence
        if not any(lo < first <= hi for lo, hi in ranges):
            return True
        if any(lo < first <= hi for lo, hi in fine) or not any(lo == first for lo, _ in fine):
            return False
        # Inside an archive, at one of its parts: only if every part before the start is shown.
        shown = {x.id for block in stable(i) for x in block.items}
        return all(x.id in shown for x in split(i))

    def ranked(i: int) -> list[Summary]:
        """The topic summaries covering what comes before unit ``i``, most wanted first."""
        first = units[i][0].sequence
        return _topic_priority([t for t in rows.topics if t.last_sequence < first])

    def archives_before(i: int) -> _Block:
        """The archives that end before unit ``i`` (the window holds the rest word for word)."""
        first = units[i][0].sequence
        if all(a.last_sequence < first for a in all_archives.items):
            return all_archives
        parts = [x for x in split(i) if x.tier != "topic"] if pieces else []
        return _fill(
            "bulk",
            [*(a for a in reversed(rows.archives) if a.last_sequence < first), *reversed(parts)],
            bulk_limit,
            measure,
        )

    # A window chosen before at this budget moves (else the context is laid out afresh).
    moving = rows.mark is not None and rows.mark.budget == max_tokens
    archived_upto = max((a.last_sequence for a in rows.archives), default=0)

    # Made once per start (within this call): a new start is looked for at each room in turn.
    @cache
    def stable(i: int) -> tuple[_Block, _Block]:
        """The archives, and the topic summaries covering what comes before unit ``i``.

        Shown first: the topic parts of an archive the window starts inside, which take its
        place (and its room); then, when the window moves, the topic summaries no archive holds
        yet (what windows left since maintenance last merged), which may take the room the
        archives leave of the summary tiers' shares. Else, where the archives hold the topic
        tier's room (so the topic tier has none of its own), that stretch of the timeline could be
        missing from the context until the window moved again. (A first read, which keeps no
        prefix yet, leaves them to the room its window leaves: the window stays as full as it can.)
        """
        archives = archives_before(i)
        first = units[i][0].sequence
        parts = [x for x in split(i) if x.tier == "topic"] if pieces else []
        unmerged: list[Summary] = []
        if moving:
            unmerged = [
                t
                for t in rows.topics
                if archived_upto < t.first_sequence and t.last_sequence < first and t.content
            ]
        if not parts and not unmerged:
            return archives, _fill("topic", ranked(i), topic_limit, measure)
        held = _fill("topic", parts, avail, measure).tokens if parts else 0
        limit = topic_limit + max(held, bulk_limit - archives.tokens)
        first_ids = {t.id for t in unmerged}
        wanted = [*parts, *_topic_priority(unmerged), *(t for t in ranked(i) if t.id not in first_ids)]
        return archives, _fill("topic", wanted, limit, measure)

    def frozen() -> tuple[_Block, _Block]:
        """The blocks shown when the window start was chosen (they stay until it moves)."""
        return (
            _fill("bulk", [x for x in rows.frozen if x.tier != "topic"], avail, measure),
            _fill("topic", [x for x in rows.frozen if x.tier == "topic"], avail, measure),
        )

    @cache
    def extended(i: int) -> tuple[_Block, _Block] | None:
        """The blocks shown so far, with the topic summaries of what a window starting at unit
        ``i`` no longer holds appended: a new start then rewrites only the window, not the blocks
        before it, which a provider keeps serving from its cache. ``None`` when that is not
        possible: a block shown so far was merged or rolled up since (an event that rewrites
        anyway), or not every summary of what the window leaves fits the topic tier."""
        if not rows.frozen or rows.mark is None:
            return None
        first = units[i][0].sequence
        # Parts of an archive shown in its place still stand for their ranges while they are read.
        live = {x.id for x in (*rows.topics, *rows.archives, *rows.finer)}
        if any(x.id not in live or x.last_sequence >= first for x in rows.frozen):
            return None
        shown = [x for x in rows.frozen if x.tier == "topic"]
        last = max((x.first_sequence for x in shown), default=0)
        # A window that started inside an archive (where one of its parts ends) left what the
        # archive holds after that: its blocks are chosen anew, with the parts in its place.
        if any(a.first_sequence < first and a.last_sequence >= rows.mark.start for a in rows.archives):
            return None
        left = [t for t in rows.topics if rows.mark.start <= t.first_sequence and t.last_sequence < first]
        if any(t.first_sequence <= last for t in left):
            return None
        bulk = _fill("bulk", [x for x in rows.frozen if x.tier != "topic"], avail, measure)
        previous = _fill("topic", shown, avail, measure)
        topic = _fill("topic", shown + left, max(topic_limit, previous.tokens), measure)
        if len(topic.items) < len(shown) + len(left) or len(bulk.items) < len(rows.frozen) - len(shown):
            return None
        return bulk, topic

    # The window gets its share, and whatever the stable blocks beside a window of that share
    # leave of theirs: it never grows over the summaries the topic tier has room to show (a
    # summary keeps more of a topic per token than its oldest messages word for word).
    at_share = next((i for i in range(len(units)) if suffix[i] <= alloc.current), len(units) - 1)
    while at_share < len(units) - 1 and not aligned(at_share):
        at_share += 1
    full = stable(at_share)
    limit = avail - reserve - full[0].tokens - full[1].tokens
    if not shares.redistribute:
        limit = min(limit, alloc.current)

    def short(i: int, room: int) -> bool:
        """Whether a new window from unit ``i`` leaving ``room`` is within the window's limit
        (``fits`` says no otherwise, whatever the blocks: ``_choose`` checks it first, which
        spares making them)."""
        return suffix[i] + room <= limit or i == len(units) - 1

    def fits(
        i: int, blocks: tuple[_Block, _Block], room: int, kept: bool = False, event: bool = False
    ) -> bool:
        """Whether a window from unit ``i`` beside ``blocks`` leaves ``room`` to grow into.

        The window's limit decides where a new start goes; a kept start stays while the context
        still fits with that room (moving it rewrites the prefix every provider caches), unless
        the tiers keep to their shares (no redistribution): then an ``event`` brings it back
        within its limit. The recall reserve and the growth room overlap: recall uses the room
        the current topic has not grown into yet, so a new start leaves the larger of the two, a
        kept one the growth room only (recall then gets what the window leaves, up to its reserve).
        """
        bounded = not kept or (event and not shares.redistribute)
        if bounded and not short(i, room):
            return False
        free = room if kept else max(room, reserve)
        return suffix[i] + free + blocks[0].tokens + blocks[1].tokens <= avail

    if not cacheable:
        return _relevance_layout(
            conversation_id,
            max_tokens,
            alloc,
            pinned,
            units,
            suffix,
            at_share,
            archives_before(at_share),
            rows,
            ranked,
            avail,
            used,
            measure,
            shares.redistribute,
            short_reserve,
        )

    def widen(
        i: int, blocks: tuple[_Block, _Block], room: int, append: bool = False
    ) -> tuple[_Block, _Block]:
        """The blocks beside a new window start, given what that window leaves unused beyond its
        growth room: windows start only at summary boundaries, so that slack can be a whole
        topic's worth. More topic summaries, then more archives, fill it; they stay until the
        window moves again, so the prefix a provider caches does not change for it."""
        spare = avail - max(room, reserve) - suffix[i] - blocks[0].tokens - blocks[1].tokens
        if spare <= 0:
            return blocks
        bulk, topic = blocks

        def grown(block: _Block, candidates: Iterable[Summary]) -> _Block:
            """``block`` with those of ``candidates`` it lacks that fit in ``spare`` more tokens,
            or ``block`` itself unless that adds to it and keeps all it held."""
            ids = {x.id for x in block.items}
            extra = [x for x in candidates if x.id not in ids]
            more = _fill(block.tier, [*block.items, *extra], block.tokens + spare, measure)
            return more if more.tokens > block.tokens and ids <= {x.id for x in more.items} else block

        # Blocks kept from the previous start only grow at their end: their text stays a prefix.
        after = max((x.first_sequence for x in topic.items), default=0) if append else 0
        more = grown(topic, (t for t in ranked(i) if t.first_sequence > after))
        spare -= more.tokens - topic.tokens
        topic = more
        if append:
            return bulk, topic
        first = units[i][0].sequence
        bulk = grown(bulk, (a for a in reversed(rows.archives) if a.last_sequence < first))
        # Room still left shows the newest archives as what they were made of (chosen with the
        # start: the blocks then stay until the window moves, like the rest).
        return unroll(bulk, topic, rows.finer, avail - max(room, reserve) - suffix[i], measure)

    step = max(int(limit * shares.anchor), 1)
    chosen, (archives, topics) = _choose(
        units, step, stable, frozen, fits, aligned, rows, max_tokens, widen, extended, short
    )
    if chosen is None:
        # Not even the newest unit fits beside the stable blocks: the newest unit, and of the
        # blocks what the room it leaves holds (archives first: the whole timeline at its coarsest),
        # rather than no summary at all beside a large tool result.
        chosen = len(units) - 1
        left = avail - suffix[chosen]
        archives = _fill("bulk", archives_before(chosen).items, min(bulk_limit, left), measure)
        topics = _fill("topic", ranked(chosen), min(topic_limit, left - archives.tokens), measure)
    window = [m for u in units[chosen:] for m in u]
    # Recall gets its reserve, and no more: what it sends changes every turn, so whatever it uses
    # is sent uncached; the rest of the room is where the current topic grows until the next event.
    room = min(avail - suffix[chosen] - topics.tokens - archives.tokens, reserve)
    recalled, note, note_tokens = _recall(rows, window, topics, archives, room, measure)
    at = _recall_position(window)
    return _context(
        conversation_id,
        max_tokens,
        alloc,
        pinned,
        archives,
        topics,
        [window],
        recalled,
        note,
        note_tokens,
        rows,
        used,
        False,
        at,
    )


def _relevance_layout(
    conversation_id: str,
    max_tokens: int,
    alloc: Allocation,
    pinned: list[StoredMessage],
    units: Sequence[Sequence[StoredMessage]],
    suffix: Sequence[int],
    at_share: int,
    archives: _Block,
    rows: Rows,
    ranked: Callable[[int], list[Summary]],
    avail: int,
    used: int,
    measure: Measure,
    redistribute: bool,
    reserve: int,
) -> CompressedContext:
    """A context too short for a provider to cache, laid out for relevance alone.

    The window takes its share, and recall comes first (what matches the newest message wins over
    what is merely recent). When redistributing, the archives hold the topic tier's share as well
    as their own (:func:`~.budget.summary_shares`), and what is recalled takes the place of the
    window's oldest units: up to the topic tier's share for a question about the past, up to
    ``reserve`` for a weak query, nothing for an answered one (see :func:`_first_recall`);
    without, recall stays within the topic tier's share. Topic summaries fill what recall leaves;
    then the window reaches back over what is left, swapping the newest summaries back for their
    messages while they fit; room still left (whole items rarely fill it exactly) goes to more
    recall.
    """
    chosen = at_share
    if suffix[chosen] + archives.tokens > avail:
        archives = _Block("bulk")
    window = [m for u in units[chosen:] for m in u]
    # What matches the newest message wins over what is merely recent: recall may take all the
    # room the window and the archives leave (only the topic tier's share without redistributing).
    free = avail - suffix[chosen] - archives.tokens
    room = free if redistribute else min(alloc.topics, free)
    first = _first_recall(rows, window, reserve)
    # A question about the past may recall as much as the archives hold (what matches it weighs
    # as much as the summary of the whole timeline): the topic tier's share, and beyond it the
    # window's oldest units, as long as the newest unit and the one before it (what the question
    # may point back to) stay.
    want = alloc.topics + alloc.bulk if first is None else first
    if redistribute and room < want:
        # The archives hold the topic tier's whole share here (summary_shares): what the newest
        # message recalls, up to that share for a question about the past and up to ``reserve``
        # for a weak query, takes the place of the window's oldest units (the archives are whole
        # roll-ups; shrinking them would take the oldest part of the timeline out).
        room = min(want, alloc.topics, avail - archives.tokens - suffix[len(units) - 1])
        if want > alloc.topics:
            room = max(room, min(want, avail - archives.tokens - suffix[max(len(units) - 2, 0)]))
    elif first is not None:
        room = min(room, want)
    recalled, note, note_tokens = _recall(rows, window, _Block("topic"), archives, room, measure)
    spent = note_tokens + sum(_cost(c.messages) for c in recalled)
    while chosen < len(units) - 1 and suffix[chosen] + archives.tokens + spent > avail:
        chosen += 1  # the newest unit always stays: the room above left it out
    taken = {c.summary.id for c in recalled if c.summary is not None}
    free = avail - suffix[chosen] - archives.tokens - spent
    topic_room = free if redistribute else min(alloc.topics - spent, free)
    candidates = [t for t in ranked(chosen) if t.id not in taken]
    topics = _fill("topic", candidates, topic_room, measure)
    if redistribute and rows.finer:
        # Room the summaries leave goes first to the newest archives' parts (a finer resolution
        # of the past) and only then to older messages word for word: a summary line keeps more
        # of a topic per token than its messages.
        archives, topics = unroll(
            archives,
            topics,
            [x for x in rows.finer if x.id not in taken],
            avail - suffix[chosen] - spent,
            measure,
        )
    cap = avail if redistribute else max(alloc.current, suffix[chosen])
    # Recalled messages are not repeated; what an archive shown covers is not repeated either.
    floor = max([c.last for c in recalled] + [a.last_sequence for a in archives.items] + [0])

    def fits(i: int, block: _Block) -> bool:
        return suffix[i] <= cap and suffix[i] + archives.tokens + block.tokens + spent <= avail

    while chosen > 0 and units[chosen - 1][0].sequence > floor:
        newest = max(topics.items, key=lambda t: t.last_sequence, default=None)
        prev = units[chosen - 1][0].sequence
        if newest is None or prev > newest.last_sequence:
            if not fits(chosen - 1, topics):
                break
            chosen -= 1
            continue
        # The previous message is in the newest summary shown: swap the summary back for its
        # messages if they fit in its place.
        start = next((j for j in range(chosen) if units[j][0].sequence >= newest.first_sequence), chosen)
        rest = _fill("topic", [t for t in topics.items if t.id != newest.id], topics.tokens, measure)
        if start >= chosen or units[start][0].sequence <= floor:
            break
        if not fits(start, rest):
            break
        chosen, topics = start, rest
    window = [m for u in units[chosen:] for m in u]
    # Whole units and summaries rarely fill the room exactly: what the window and the summaries
    # left goes to recall too (the picks are greedy by score, so they only gain).
    left = avail - suffix[chosen] - archives.tokens - topics.tokens - spent
    if not redistribute:
        left = min(left, alloc.topics - topics.tokens - spent)
    if left > 0 and rows.recall:
        more = _recall(rows, window, topics, archives, spent + left, measure)
        if more[2] + sum(_cost(c.messages) for c in more[0]) > spent:
            recalled, note, note_tokens = more
    return _context(
        conversation_id,
        max_tokens,
        alloc,
        pinned,
        archives,
        topics,
        [window],
        recalled,
        note,
        note_tokens,
        rows,
        used,
        False,
        _recall_position(window),
    )


def _choose(
    units: Sequence[Sequence[StoredMessage]],
    step: int,
    stable: Callable[[int], tuple[_Block, _Block]],
    frozen: Callable[[], tuple[_Block, _Block]],
    fits: Callable[..., bool],
    aligned: Callable[[int], bool],
    rows: Rows,
    budget: int,
    widen: Callable[[int, tuple[_Block, _Block], int, bool], tuple[_Block, _Block]] = lambda i, b, r, a: b,
    extended: Callable[[int], tuple[_Block, _Block] | None] = lambda i: None,
    short: Callable[[int, int], bool] = lambda i, room: True,
) -> tuple[int | None, tuple[_Block, _Block]]:
    """The unit the window starts at, and the blocks beside it.

    Between events the window keeps its start (the mark) and the blocks shown with it. At the
    first read after an event it keeps them too if the window can still grow until the next seal.
    Otherwise it starts anew at the earliest unit that leaves room for that growth, and for at
    least ``step`` tokens, so that the next move is a while away (like "append until full, then
    drop the oldest part"); the blocks shown so far are kept with the summaries of what the window
    left appended (``extended``) when they are all still live and fit, else chosen anew; either way
    what that start leaves unused beyond the growth room goes to more summaries (``widen``). Only
    a window that no longer fits at all moves between events.
    """
    first = 0
    mark = rows.mark
    # A summary shown beside the window that an event undid (its topic reopened by a reply) no
    # longer stands for its messages: the window and blocks are chosen anew. (A summary merged
    # since still does: it stays until the window moves, the prefix with it.)
    undone = any(x.status == "superseded" for x in rows.frozen)
    keep = mark is not None and mark.budget == budget and not undone
    i0 = _kept_start(units, mark.start, aligned) if keep and mark is not None else None
    if mark is not None and i0 is not None:
        blocks = frozen() if rows.frozen or not mark.shown else stable(i0)
        # After an event the kept start must leave the growth until the next seal; between
        # events, only fit.
        event = mark.epoch != rows.epoch
        if fits(i0, blocks, rows.growth if event else 0, kept=True, event=event):
            return i0, blocks
        first = i0 + 1
    # With no prefix cached yet (no mark for this budget) the window is as full as the growth
    # until the next seal allows; a move afterwards leaves room for a step as well.
    fresh = mark is None or mark.budget != budget
    # When no start leaves all the growth, the one leaving most of it wins over the fullest window:
    # a window left no room at all moves again on the next message.
    less = (rows.growth // 2, rows.growth // 4, rows.growth // 8, 0)
    for room in (rows.growth, *less) if fresh else (max(rows.growth, step), rows.growth, *less):
        for i in range(first, len(units)):
            if (not aligned(i) and i < len(units) - 1) or not short(i, room):
                continue
            kept = extended(i)
            if kept is not None and fits(i, kept, room):
                return i, widen(i, kept, room, True)
            blocks = stable(i)
            if fits(i, blocks, room):
                return i, widen(i, blocks, room, False)
    return None, (_Block("bulk"), _Block("topic"))


def _kept_start(
    units: Sequence[Sequence[StoredMessage]], start: int, aligned: Callable[[int], bool]
) -> int | None:
    """The unit a window marked as starting at message ``start`` starts at now, if any.

    Usually the unit that begins there. Its first message can be gone from the units since: a tool
    call left unanswered once the user moved on is left out, a message pinned since leaves the
    window. The window then starts at the next unit, so what came before it (the cached prefix)
    stays as it was; unless that unit lies inside a summarised range (never a window start).
    """
    i = bisect_left(units, start, key=lambda u: u[0].sequence)
    if i == len(units) or (units[i][0].sequence != start and not aligned(i)):
        return None
    return i


def _recall_position(window: Sequence[StoredMessage]) -> int:
    """Where recalled messages go in the current topic: just before its newest user message, or,
    with none in the window, just before its newest unit (a tool call with its results): never
    after the newest message, which the model must answer (a tool result, in a tool loop)."""
    for i in range(len(window) - 1, -1, -1):
        if window[i].role == "user":
            return i
    i = len(window)
    while i > 0 and window[i - 1].role in RESULT_ROLES:
        i -= 1
    return max(i - 1, 0)


def _recall(
    rows: Rows,
    window: Sequence[StoredMessage],
    topics: _Block,
    archives: _Block,
    room: int,
    measure: Measure,
) -> tuple[list[Recalled], str, int]:
    """The best-matching units and summaries not in the context already, within ``room``."""
    if not rows.recall or room <= 0:
        return [], "", 0
    start = window[0].sequence if window else 1 << 62
    shown = {s.id for s in topics.items} | {s.id for s in archives.items}
    sample = datetime(2000, 1, 1, tzinfo=UTC)  # any date: the note's length hardly depends on it
    # A one-span note: one naming more spans is measured at the end, where the weakest pick goes if
    # it then does not fit (allowing for the longest note here cost query retention at 1k 0.6 points).
    note_estimate = measure(recall_note([(1, start)], sample, sample)) + 8
    # What may be recalled at all, best first, with its cost: not in the context already (a summary
    # shown, a message in the window), no pinned message (those are sent first anyway).
    eligible: list[tuple[Recalled, int]] = []
    for cand in sorted(rows.recall, key=lambda c: -c.score):
        if cand.summary is not None:
            if cand.summary.id in shown or cand.summary.first_sequence >= start:
                continue
            eligible.append((cand, cand.summary.token_count))
        elif (
            cand.messages and cand.messages[-1].sequence < start and not any(m.pinned for m in cand.messages)
        ):
            eligible.append((cand, _cost(cand.messages)))
    # The picks are made against an estimate of the note; measured exactly, the weakest pick goes
    # and the rest of the room is chosen again without it (so more room never recalls less).
    pool = _Pool(eligible, rows.query, measure)
    dropped: set[int] = set()
    lines: dict[int, str] = {}  # the dated line of each recalled summary (picked again and again)
    while True:
        chosen = _pick(pool, dropped, room, note_estimate)
        if not chosen:
            return [], "", 0
        picked = sorted((c for _, c in chosen), key=lambda c: (c.first, c.last))
        # The note names what was recalled and carries the recalled summaries as dated lines.
        times = [m.timestamp for c in picked for m in c.messages] + [
            t for c in picked if c.summary is not None for t in (c.summary.started_at, c.summary.ended_at)
        ]
        spans = [(c.first, c.last) for c in picked]
        texts = [recall_note(spans, min(times), max(times))]
        for c in picked:
            if c.summary is not None:
                line = lines.get(id(c.summary))
                if line is None:
                    line = lines[id(c.summary)] = _line(c.summary)
                texts.append(line)
        note = "\n".join(texts)
        note_tokens = measure(note)
        total = note_tokens + sum(_cost(c.messages) for c in picked)
        if total <= room:
            return picked, note, note_tokens
        dropped.add(min(chosen, key=lambda kc: kc[1].score)[0])


class _Pool:
    """Recall's candidates, best first with their costs, and what :func:`_pick` asks of each,
    worked out once: ``_recall`` picks from them again after each drop (three times a read, often)."""

    __slots__ = ("_cuts", "_said", "_terms", "items", "measure", "query", "seqs", "spans")

    def __init__(self, items: Sequence[tuple[Recalled, int]], query: str, measure: Measure) -> None:
        self.items = items
        self.spans = [(c.first, c.last) for c, _ in items]
        # Most candidates are one message (or a summary: none).
        self.seqs = [
            [c.messages[0].sequence] if len(c.messages) == 1 else [m.sequence for m in c.messages]
            for c, _ in items
        ]
        self._said: dict[int, str | None] = {}
        self._cuts: dict[tuple[int, int], StoredMessage | None] = {}
        self._terms: frozenset[str] | None = None
        self.query, self.measure = query, measure

    def said(self, k: int) -> str | None:
        if k not in self._said:
            self._said[k] = _said(self.items[k][0])
        return self._said[k]

    def excerpt(self, k: int, free: int) -> StoredMessage | None:
        """Candidate ``k``'s message as its best sentences within ``free`` tokens (see :func:`_excerpt`)."""
        if (k, free) not in self._cuts:
            if self._terms is None:
                self._terms = recall_terms(self.query)
            self._cuts[k, free] = _excerpt(self.items[k][0].messages[0], self._terms, free, self.measure)
        return self._cuts[k, free]


def _pick(pool: _Pool, dropped: set[int], room: int, note_estimate: int) -> list[tuple[int, Recalled]]:
    """Recall's picks from ``pool`` (best first, with their costs) but the ``dropped`` ones,
    within ``room`` less ``note_estimate``, each with its index in the pool."""
    picked: list[tuple[int, Recalled]] = []
    spent = 0
    taken: set[int] = set()  # sequences already recalled (a call and its result both match)
    spans: list[tuple[int, int]] = []
    said: set[str] = set()  # texts of the plain messages recalled: a repeat adds nothing
    done = [k in dropped for k in range(len(pool.items))]
    # First what adds something new; then, in room still left, what repeats part of a pick (a
    # message of a recalled summary's topic keeps details the summary left out).
    tries = EXCERPT_TRIES
    for distinct in (True, False):
        for k, (cand, cost) in enumerate(pool.items):
            if done[k]:
                continue
            free = room - spent - note_estimate
            # A long match that does not fit may still fit as its best sentences (only as
            # something new: a repeat's excerpt would add little).
            whole = cost <= free
            if not whole and (
                not distinct or free < EXCERPT_MIN_TOKENS or not tries or not _excerptable(cand)
            ):
                continue
            first, last = span = pool.spans[k]
            if distinct and any(first <= hi and lo <= last for lo, hi in spans):
                continue
            seqs = pool.seqs[k]
            if seqs and not taken.isdisjoint(seqs):
                continue
            # The same words again ("can I change the colour?" asked six times) take room that a
            # message saying something else could have: one copy is recalled.
            text = pool.said(k)
            if text is not None and text in said:
                continue
            if not whole:
                tries -= 1
                # An excerpt keeps its message's sequence: the span and sequences stay.
                cut = pool.excerpt(k, free)
                if cut is None:
                    continue
                cand, cost = replace(cand, messages=(cut,)), cut.token_count
            done[k] = True
            picked.append((k, cand))
            if text is not None:
                said.add(text)
            spans.append(span)
            taken.update(seqs)
            spent += cost
    return picked


def _said(cand: Recalled) -> str | None:
    """What a plain recalled message says, case and spacing aside (None for a summary or a unit)."""
    m = cand.plain
    return " ".join(m.content.lower().split()) if m is not None else None


#: A matching message too long for the room recall has left is recalled as its sentences that
#: match best (:mod:`.excerpt`), when at least this many tokens are left for them.
EXCERPT_MIN_TOKENS = 32
#: Excerpts tried at most per context (each splits and measures a long text): the best-scoring
#: long matches get them.
EXCERPT_TRIES = 4


def _excerptable(cand: Recalled) -> bool:
    """A plain message with text content (one given as parts would be sent as other parts)."""
    m = cand.plain
    return m is not None and not m.extra


def _excerpt(m: StoredMessage, terms: frozenset[str], room: int, measure: Measure) -> StoredMessage | None:
    """``m`` shown as its best-matching sentences within ``room`` framed tokens, or ``None``."""
    text = m.context_content
    empty = measure("")
    content = measure(text) - empty
    framing = m.token_count - content  # the message's own framing (role, name) as stored
    if framing < empty or not text:
        return None
    found = matching_sentences(
        text, terms, lambda shown: measure(shown) - empty + framing, room, content / len(text)
    )
    if found is None:
        return None
    return replace(m, truncated_content=found[0], token_count=found[1])


def _context(
    conversation_id: str,
    max_tokens: int,
    alloc: object,
    pinned: list[StoredMessage],
    archives: _Block,
    topics: _Block,
    window_parts: list[list[StoredMessage]],
    recalled: list[Recalled],
    note: str,
    note_tokens: int,
    rows: Rows,
    used: int,
    truncated: bool,
    recall_at: int = 0,
) -> CompressedContext:
    window = [m for part in window_parts for m in part]
    current = sum(m.token_count for m in window)
    recall_messages = [m for c in recalled for m in c.messages]
    recall_tokens = note_tokens + sum(m.token_count for m in recall_messages)
    total = used + archives.tokens + topics.tokens + current + recall_tokens
    if total > max_tokens:  # defensive: every part was measured, so this cannot happen
        raise AssertionError(f"context of {total} tokens over max_tokens={max_tokens}")
    archive_items = sorted(archives.items, key=lambda s: s.first_sequence)
    topic_items = sorted(topics.items, key=lambda s: s.first_sequence)
    recalled_summaries = [c.summary for c in recalled if c.summary is not None]
    represented = (
        REPLY_PRIMING_TOKENS
        + sum(m.full_token_count for m in pinned)
        + sum(m.full_token_count for m in window)
        + sum(m.full_token_count for m in recall_messages)
        + sum(s.source_tokens for s in archive_items + topic_items + recalled_summaries)
    )
    shown_uncovered = sum(1 for m in window if m.sequence > rows.summarized_upto)
    shown_uncovered += sum(1 for m in recall_messages if m.sequence > rows.summarized_upto)
    return CompressedContext(
        conversation_id=conversation_id,
        max_tokens=max_tokens,
        pinned=pinned,
        bulk_archives=archive_items,
        historical_topics=topic_items,
        current_topic=window,
        total_tokens=total,
        compression_ratio=round(represented / total, 4) if total else 1.0,
        tier_tokens={
            "framing": REPLY_PRIMING_TOKENS,
            "pinned": sum(m.token_count for m in pinned),
            "bulk": archives.tokens,
            "topic": topics.tokens,
            "recall": recall_tokens,
            "current": current,
        },
        allocation=alloc.as_dict(),  # type: ignore[attr-defined]
        omitted_messages=max(rows.uncovered - shown_uncovered, 0),
        truncated_newest=truncated,
        blocks={
            "bulk": archives.text() if archive_items else "",
            "topic": topics.text() if topic_items else "",
        },
        recalled=recall_messages,
        recalled_summaries=recalled_summaries,
        recall_note=note,
        recall_at=recall_at,
        recall_query=rows.query if recalled else "",
        maintenance_epoch=rows.epoch,
    )
