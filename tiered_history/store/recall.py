"""BM25 over a bounded candidate set, for the SQL backends, and a cache of the candidates.

A query word's candidates are its newest ``cap`` matching rows of the conversation (messages:
by sequence; summaries: live ones, by the last sequence they cover), each with its length in
words and, once counted, how often the word occurs in it. The database finds them (SQLite
FTS5, PostgreSQL's GIN index); ranking them is the same code on both.

The candidates are kept per process between calls, because a reply's query mostly repeats
words the conversation used before, and finding and counting them again was most of the cost
of a read with recall on (8 ms of 9 at 100,000 messages on SQLite; 30-90 ms on PostgreSQL):

* messages are only ever appended, so a word's list stays valid for the sequences it was
  searched up to (``upto``); a later call asks the database only for matching rows after them
  and puts them in front (the newest ``cap`` of both are what a new search would find);
* summaries change in place (a pending topic gets its summary, topics merge into archives),
  so a word's list is valid only while the conversation's search key is the same: the state
  fields every such change moves, a seal excepted (it adds a pending topic, which no search
  finds): :attr:`~..core.state.ConversationState.search_key`. When the key says the only
  change was pending topics getting their first summaries (maintenance's usual step), a kept
  list takes in those of the new summaries that hold its word (:func:`with_added`), and the
  rows kept stay valid (:meth:`CandidateCache.lineage`).

An entry is keyed by the conversation's row key and creation time (a conversation deleted and
made again is another one), so what another process wrote is found by the same rules: the
state read at the start of each search says how far the lists must reach. Only ids, lengths
and counts are kept (about 2 KB a word); rows are read from the database every time.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from ..core.ranking import K1, B, idf
from ..lru import Lru

#: Search bound: each query word's newest matching rows of a conversation that are ranked (the
#: rows of a word more common than that are estimated from how far back its newest ones reach).
CANDIDATES_PER_WORD = 64
#: PostgreSQL: a conversation of at most this many messages has its candidates for every word read
#: by one planned statement over its messages rather than a statement planned for the words.
SMALL_CONVERSATION = 256
#: SQLite: a kept message list at most this many messages behind is brought up to date by reading
#: those messages (one statement for every word) rather than by an FTS5 query per word.
RECENT_SCAN = 64
#: SQLite: in a conversation of at most this many messages, the lists of words not kept are made
#: by reading its messages (one statement for every word) rather than by an FTS5 query per word.
SMALL_SCAN = 64
#: Words (per conversation and kind) whose candidates a store keeps: about 2 KB each.
CACHED_WORDS = 8192
#: Rows found by searches (messages, summaries) that a store keeps: recall finds many again and again.
CACHED_ROWS = 2048
#: Search keys remembered as reached from an earlier one by summaries added alone (rows kept then
#: stay valid), across conversations.
LINEAGES = 1024
#: Rows with more characters than this (their text columns together) are read every time, so the
#: rows kept stay small (about 1 MB for chat-sized messages, tens of MB at the very worst).
CACHED_ROW_CHARS = 8192
#: SQLite: conversations whose newest messages (at most :data:`RECENT_SCAN`, split into words) a
#: store keeps, for bringing kept lists up to date without splitting them again at every reply.
RECENT_CONVERSATIONS = 32
#: SQLite: the newest messages kept per conversation hold at most this many characters in all
#: (split into words, about 10 bytes a character: 350 KB at most, 11 MB for all conversations).
RECENT_CHARS = 32768

Group = tuple[str, ...]
#: The occurrences of each query group in the texts of some candidates, by candidate id.
CountTexts = Callable[[list[int]], Mapping[int, Callable[[Group], int]]]


@dataclass
class Candidates:
    """One query group's newest matching rows of one conversation, newest first."""

    cap: int
    upto: Any
    """What the list covers: messages up to this sequence; summaries: this summary key."""
    after: int = 0
    """SQLite messages: the conversation's newest message id the list covers (FTS5 seeks by rowid)."""
    capped: bool = False
    """The search stopped at ``cap``: older rows may match too."""
    ids: array[int] = field(default_factory=lambda: array("q"))
    rec: array[int] = field(default_factory=lambda: array("q"))
    dl: array[int] = field(default_factory=lambda: array("q"))
    tf: array[int] = field(default_factory=lambda: array("q"))
    """The group's occurrences in each row as our word split counts them; 0 until counted."""
    seen: int = -1
    """Summaries: the rows the database returned for the list, live or not (only live ones are
    candidates, all count toward the cap); -1 where not known."""
    _positions: dict[int, int] | None = field(default=None, repr=False, compare=False)

    def positions(self) -> dict[int, int]:
        """Each row's index in the list (made once: a list's rows never change, only its counts)."""
        if self._positions is None:
            self._positions = dict(zip(self.ids, range(len(self.ids)), strict=True))
        return self._positions

    def merged(self, newer: Candidates) -> Candidates:
        """``newer`` (rows found after this list's ``upto``) in front of this list, ``cap`` in all."""
        if set(newer.ids).isdisjoint(self.ids):
            # The usual case (rows written since): the two joined by array slices, in C.
            keep = max(self.cap - len(newer.ids), 0)
            cap = self.cap
            joined = Candidates(
                cap,
                newer.upto,
                newer.after,
                newer.capped,
                newer.ids[:cap] + self.ids[:keep],
                newer.rec[:cap] + self.rec[:keep],
                newer.dl[:cap] + self.dl[:keep],
                newer.tf[:cap] + self.tf[:keep],
            )
            joined.capped = joined.capped or self.capped or len(joined.ids) >= cap
            return joined
        out = Candidates(self.cap, newer.upto, newer.after, newer.capped)
        seen: set[int] = set()
        for src in (newer, self):
            for j, i in enumerate(src.ids):
                if len(out.ids) >= self.cap:
                    out.capped = True
                    return out
                if i in seen:
                    continue
                seen.add(i)
                out.ids.append(i)
                out.rec.append(src.rec[j])
                out.dl.append(src.dl[j])
                out.tf.append(src.tf[j])
        # Exactly ``cap`` rows in all is what a new search would call cut off too.
        out.capped = out.capped or self.capped or len(out.ids) >= self.cap
        return out


#: A message as :meth:`~.sql.SQLStore._fts_new_messages` reads it: id, sequence, length (FTS5's),
#: its words counted (``None``: not a plain text, which only FTS5 may split) and its characters.
RecentRow = tuple[int, int, int, Counter[str] | None, int]


def candidates(
    cap: int, upto: Any, rows: Sequence[tuple[int, int, int, int]], found: int, after: int = 0
) -> Candidates:
    """A list from rows ``(id, recency, length, count)`` newest first; ``found``: how many rows the
    database returned before any was left out (a live-only filter), to tell whether it hit the cap."""
    ids, rec, dl, tf = zip(*rows, strict=True) if rows else ((), (), (), ())  # columns, in C
    return Candidates(
        cap,
        upto,
        after,
        found >= cap,
        array("q", ids),
        array("q", rec),
        array("q", dl),
        array("q", tf),
        found,
    )


def with_added(
    old: Candidates, added: Sequence[tuple[int, int, int, int]], upto: Any, by_recency: bool
) -> Candidates | None:
    """A summary list kept from before some summaries were written (and nothing else changed),
    with those of them that hold its group (``added``: rows ``(id, recency, length, count)``):
    what a search would find now, or ``None`` where the list cannot tell. A search finds a
    group's newest ``cap`` rows, live or not, newest by id (SQLite) or by recency, then id
    (``by_recency``: PostgreSQL, whose ties at the cap may fall either way, so there a list is
    only extended below its cap). Rows the list's search found but left out (not live) have ids
    it does not know: with any of them, it is extended only below the cap too."""
    if not added:  # no row of it changed, none was added
        return replace(old, upto=upto, _positions=None)
    if old.seen < 0 or not set(old.ids).isdisjoint(i for i, _, _, _ in added):
        return None
    seen = old.seen + len(added)
    if seen >= old.cap and (by_recency or old.seen > len(old.ids)):
        return None
    rows = [*zip(old.ids, old.rec, old.dl, old.tf, strict=True), *added]
    rows.sort(key=(lambda x: (-x[1], -x[0])) if by_recency else (lambda x: -x[0]))
    out = candidates(old.cap, upto, rows[: old.cap], min(seen, old.cap))
    out.capped = out.capped or old.capped
    return out


def by_word(
    rows: Iterable[tuple[int, int, int, Sequence[str] | None, Sequence[int] | None]],
    wanted: Mapping[str, Group],
) -> dict[Group, list[tuple[int, int, int, int]]]:
    """Rows ``(id, recency, length, words, counts)`` (newest first; ``words`` among ``wanted``'s
    keys) as each wanted group's ``(id, recency, length, count)`` rows, newest first."""
    out: dict[Group, list[tuple[int, int, int, int]]] = {g: [] for g in wanted.values()}
    for i, r, dl, found, counts in rows:
        if found and counts:
            for w, n in zip(found, counts, strict=True):
                g = wanted.get(w)
                if g is not None:
                    out[g].append((i, r, dl, n))
    return out


class CandidateCache:
    """The candidates of recent (conversation, kind, word) triples of one store, and the rows
    recently found (read once while they cannot change)."""

    def __init__(self, size: int = CACHED_WORDS, rows: int = CACHED_ROWS) -> None:
        self._lru: Lru[Candidates] = Lru(size)
        self._rows: Lru[Any] = Lru(rows)
        self._lineage: Lru[str] = Lru(LINEAGES)
        self._recent: Lru[Mapping[int, RecentRow]] = Lru(RECENT_CONVERSATIONS)

    def recent(self, conversation: str) -> Mapping[int, RecentRow] | None:
        """The newest messages of ``conversation`` as :meth:`keep_recent` was given them, by sequence."""
        return self._recent.get(conversation)

    def keep_recent(self, conversation: str, rows: Mapping[int, RecentRow]) -> None:
        """Keep a conversation's newest messages as split (SQLite: messages never change; a
        conversation made again has another key)."""
        self._recent.put(conversation, rows)

    def lineage(self, conversation: str, key: Any) -> str:
        """Under what a conversation's summary rows are kept at search key ``key``: the oldest key
        since which summaries were only added (their other rows unchanged), else ``key``."""
        own = f"{conversation}\x1f{key}"
        return self._lineage.get(own) or own

    def alias(self, conversation: str, before: Any, now: Any) -> None:
        """From search key ``before`` to ``now`` summaries were only added: rows kept stay valid."""
        self._lineage.put(f"{conversation}\x1f{now}", self.lineage(conversation, before))

    def rows(self, conversation: str, ids: Iterable[int]) -> dict[int, Any]:
        """The kept rows among ``ids`` of a conversation (as :meth:`keep_row` was given it)."""
        ids = list(ids)
        found = self._rows.get_each([f"{conversation}\x1f{i}" for i in ids])
        return {i: row for i, row in zip(ids, found, strict=True) if row is not None}

    def keep_row(self, conversation: str, i: int, row: Any) -> None:
        """Keep a row that cannot change while ``conversation`` names it: a message (which never
        changes), or a summary under ``conversation`` extended by the search key."""
        self._rows.put(f"{conversation}\x1f{i}", row)

    @staticmethod
    def key(conversation: str, kind: str, group: Group) -> str:
        return f"{conversation}\x1f{kind}\x1f{' '.join(group)}"

    def get(self, key: str) -> Candidates | None:
        return self._lru.get(key)

    def put(self, key: str, value: Candidates) -> None:
        self._lru.put(key, value)

    def forget(self, conv: int) -> None:
        """Drop a conversation's lists (it was deleted: a new one may get its key on SQLite)."""
        self._lru.drop(lambda key: key.startswith(f"{conv}:"))
        self._rows.drop(lambda key: key.startswith(f"{conv}:"))
        self._lineage.drop(lambda key: key.startswith(f"{conv}:"))
        self._recent.drop(lambda key: key.startswith(f"{conv}:"))


def collection(
    summary: bool, body: Mapping[str, Any], lengths: Sequence[int], last: int
) -> tuple[int, float]:
    """BM25's document count and mean length: the conversation's own (kept in its state document)
    for messages; for summaries, its topic and archive counts and the candidates' mean length."""
    if summary:
        n = max(int(body.get("topics", 0)) + int(body.get("archives", 0)), len(lengths))
        avg = sum(lengths) / max(len(lengths), 1)
    else:
        n, avg = last, body.get("words", 0) / last
    return n, max(avg, 1.0)


def rank(
    lists: Mapping[Group, Candidates],
    weights: Mapping[Group, float],
    n: int,
    avg: float,
    last: int,
    limit: int,
    count: CountTexts | None,
) -> list[tuple[float, int, int]]:
    """The best ``limit`` candidates as (score, id, recency), by BM25, recency breaking ties.

    Occurrences not counted yet are bounded by the row's length: candidates are visited by their
    bound, and only those that could still be among the best ``limit`` have their text counted
    (``count``), which fills the lists for the next call.

    First the rows held by several query groups and the rows of the heaviest group's list; then,
    lightest group last, the rows of each other list alone, while its group could still add up
    to the ``limit``-th score found so far (a group adds less than its weight times ``K1 + 1``
    to a row, whatever its count): most lists are of words too common to matter once the rarer
    ones have found their rows, and their rows are then neither bounded, sorted nor counted."""
    coef: dict[Group, float] = {}
    for g, c in lists.items():
        # Below the cap, the matching rows themselves; cut off by it, as many per message as
        # among the messages since its oldest candidate.
        df = c.cap * last / max(last - min(c.rec) + 1, 1) if c.capped and c.rec else len(c.ids)
        coef[g] = weights[g] * idf(n, min(round(df), n))
    # Per candidate: how many of the query groups it holds (counted in C, one pass).
    held: Counter[int] = Counter(chain.from_iterable(c.ids for c in lists.values()))
    if not held:
        return []
    r = _Ranking(lists, coef, held, avg, limit, count)
    if limit < 1 or any(w <= 0.0 for w in coef.values()):  # no bound to stop at: all of them
        r.visit(r.bound(None, list(lists)))
        return r.result()
    by_weight = sorted(coef, key=coef.__getitem__, reverse=True)
    first = {i for i, k in held.items() if k > 1}
    first.update(lists[by_weight[0]].ids)
    r.visit(r.bound(first, list(lists)))
    for g in by_weight[1:]:
        if coef[g] * (K1 + 1.0) * (1.0 + _SLACK) < r.kth:
            break  # this group's rows alone, and the lighter groups', score under the best ``limit``
        r.visit(r.bound(set(lists[g].ids).difference(r.bounds), [g]))
    return r.result()


#: Rounding allowance of a bound of what a group adds (relative): far above a few roundings' error.
_SLACK = 1e-9


class _Ranking:
    """The state of one :func:`rank`: bounds and scores of the candidates visited so far."""

    def __init__(
        self,
        lists: Mapping[Group, Candidates],
        coef: Mapping[Group, float],
        held: Mapping[int, int],
        avg: float,
        limit: int,
        count: CountTexts | None,
    ) -> None:
        self.lists, self.coef, self.held, self.limit, self.count = lists, coef, held, limit, count
        # BM25's length norm of a row, by its length (a few dozen lengths among hundreds of rows);
        # a row's length is the same in every list holding it (the index's count of its text).
        self.norms = {dl: K1 * (1.0 - B + B * (dl if dl > 1 else 1) / avg) for dl in _distinct_lengths(lists)}
        self.bounds: dict[int, float] = {}
        self.recency: dict[int, int] = {}
        self.uncounted: set[int] = set()
        # The best so far as (-score, -recency, -id): sorted as plain tuples, best and newest first.
        self.best: list[tuple[float, int, int]] = []
        self.pending: list[int] = []
        #: Each list with its group, weight, group size and row positions (made at the first count).
        self.columns: list[tuple[Group, Candidates, float, int, dict[int, int]]] | None = None
        self.kth = float("-inf")
        self.step = max(limit // 2, 8)  # texts counted a few at a time: each costs

    def bound(self, wanted: set[int] | None, among: list[Group]) -> list[int]:
        """Bound the candidates in ``wanted`` (``None``: all) not bounded yet, from the lists
        ``among`` (every list holding them, in order); they are returned.

        A candidate's bound is its score when its occurrences are all counted; else how often a
        word not counted yet may occur in a row at most is its length less one for each other
        query group it holds. Summed over its lists in their order; its recency as the first of
        them has it."""
        bounds, recency, uncounted = self.bounds, self.recency, self.uncounted
        held, norms, get, k1p1 = self.held, self.norms, self.bounds.get, K1 + 1.0
        new: list[int] = []
        if wanted is None:
            wanted = set(held)
        for g in among:
            c = self.lists[g]
            cg, size = self.coef[g], len(g)
            for i, r, dl, tf in zip(c.ids, c.rec, c.dl, c.tf, strict=True):
                if i not in wanted:
                    continue
                most = ((dl if dl > 1 else 1) - held[i] + 1) // size
                if most < 1:
                    most = 1
                if not tf:
                    uncounted.add(i)
                    t = most
                elif tf < most:
                    t = tf
                else:
                    t = most
                before = get(i)
                if before is None:
                    recency[i] = r
                    new.append(i)
                    before = 0.0
                bounds[i] = before + cg * t * k1p1 / (t + norms[dl])
        return new

    def visit(self, ids: list[int]) -> None:
        """Visit ``ids`` by bound, best first: a counted candidate's bound is its score, so once
        ``limit`` scores are in hand, those with bounds under the ``limit``-th are left. (Sorted
        in C; the order of equal bounds changes nothing: every candidate whose bound reaches the
        ``limit``-th score is visited, and ``best`` is sorted in full.)"""
        bounds, best, pending, limit = self.bounds, self.best, self.pending, self.limit
        for i in sorted(ids, key=bounds.__getitem__, reverse=True):
            if bounds[i] < self.kth:
                break
            if i in self.uncounted:
                pending.append(i)
                if len(pending) >= self.step:
                    self.settle()
            else:
                best.append((-bounds[i], -self.recency[i], -i))
                if len(best) >= 2 * limit:
                    self.settle()
        self.settle()

    def settle(self) -> None:
        """Count the pending candidates' texts, keep the best ``limit``, raise the bar."""
        pending, best, held, k1p1 = self.pending, self.best, self.held, K1 + 1.0
        if pending:
            if self.count is None:
                raise ValueError("occurrences left uncounted and nothing to count them with")
            counted = self.count(pending)
            if self.columns is None:
                self.columns = [(g, c, self.coef[g], len(g), c.positions()) for g, c in self.lists.items()]
            norms, recency = self.norms, self.recency
            for i in pending:
                tf_of = counted.get(i)
                # Summed over its lists in their order, up to the last of the ``held[i]`` holding it.
                score, left = 0.0, held[i]
                for g, c, cg, size, at in self.columns:
                    j = at.get(i)
                    if j is None:
                        continue
                    c.tf[j] = tf = max(tf_of(g), 1) if tf_of is not None else 1
                    # Bounded by the index's own length of the row (its word split may differ).
                    dl = c.dl[j]
                    t = min(tf, max(((dl if dl > 1 else 1) - held[i] + 1) // size, 1))
                    score += cg * t * k1p1 / (t + norms[dl])
                    left -= 1
                    if not left:
                        break
                best.append((-score, -recency[i], -i))
            pending.clear()
        best.sort()
        del best[self.limit :]
        if len(best) >= self.limit:
            self.kth = -best[-1][0]

    def result(self) -> list[tuple[float, int, int]]:
        return [(-score, -i, -r) for score, r, i in self.best]


def _distinct_lengths(lists: Mapping[Group, Candidates]) -> set[int]:
    """Every row length among the lists."""
    out: set[int] = set()
    for c in lists.values():
        out.update(c.dl)
    return out
