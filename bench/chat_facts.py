"""Retention on long two-party chats: facts said weeks before, asked about at the end.

    python -m bench.chat_facts --out docs/benchmarks.md      # about 3 minutes on 2 cores

QMSum (``bench.retention``) is meetings: every turn a ``user`` message, one sitting. A bot's
chats are two-party and span weeks. This probe builds such chats from TIAGE's PersonaChat
dialogues (``../shared/data/tiage``), each dialogue a session 6-60 hours after the one before
(so silence seals each), ``user`` and ``assistant`` alternating, and plants one fact per chosen
session: a user message saying something worth remembering ("the code for the storage unit is
4821"), answered by a one-line acknowledgement. At the end each fact is asked about (a question
that shares only some words with it) as the newest user message, on a copy of the chat, and
the context is scored as in ``bench.retention``: the share of the fact's content words it holds
(query retention). The context read at the end of the chat, before any question, is scored
against every fact (static retention). Every system of ``bench.retention`` runs on the same chats.

The facts and questions are synthetic (templates with random names, places and numbers, fixed
seeds): they say whether a system keeps what a user said in an earlier session, not how well
it reads any one dataset. Nothing in the library is tuned on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as ``python bench/chat_facts.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench._common import git_revision, log, machine, table, update_section
from bench.retention.data import START, Meeting, Query, Turn, content_words
from bench.retention.prefix import CHAT_TURN_SECONDS, SESSION_GAP_HOURS
from bench.retention.replay import MeetingResult, run_loaded

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
#: (TIAGE file, seed) of each chat: different dialogues and facts.
CHATS = (("anno_test.json", 1), ("anno_dev.json", 2), ("anno_train.json", 3), ("anno_train.json", 4))

NAMES = (
    "Marguerite",
    "Tobias",
    "Ingrid",
    "Rafael",
    "Anouk",
    "Dmitri",
    "Yolanda",
    "Casimir",
    "Priya",
    "Henrik",
)
CITIES = (
    "Lisbon",
    "Tallinn",
    "Valparaiso",
    "Ljubljana",
    "Hobart",
    "Bergen",
    "Cusco",
    "Tbilisi",
    "Porto",
    "Nagoya",
)
HOBBIES = ("saxophone", "kayaking", "sourdough", "pottery", "chess", "beekeeping", "archery", "astronomy")
MONTHS = ("January", "March", "April", "June", "August", "October", "November")


def fact(rng: random.Random) -> tuple[str, str]:
    """A fact a user tells the bot, and the question asked about it weeks later."""
    name, city, hobby, month = rng.choice(NAMES), rng.choice(CITIES), rng.choice(HOBBIES), rng.choice(MONTHS)
    k, code = rng.randint(2, 9), rng.randint(1000, 9999)
    dog = rng.choice(("beagle", "greyhound", "corgi", "dachshund"))
    job = rng.choice(("pharmacist", "surveyor", "glassblower", "actuary"))
    allergy = rng.choice(("penicillin", "shellfish", "latex", "hazelnuts"))
    food = rng.choice(("georgian", "peruvian", "ethiopian", "basque"))
    facts = (
        (
            f"my sister {name} is getting married in {city} in {month} , i need to book flights",
            "where is my sister getting married again ?",
        ),
        (
            f"i adopted a dog last week , we named him {name} , he is a {dog}",
            "what did we name the dog i adopted ?",
        ),
        (
            f"i just started a new job as a {job} at a company called {name}works",
            "what is my new job and where ?",
        ),
        (
            f"the code for the storage unit is {code} , please remember it for me",
            "what was the storage unit code ?",
        ),
        (
            f"i have been learning {hobby} for {k} months now , my teacher is called {name}",
            f"who teaches me {hobby} ?",
        ),
        (
            f"we are moving to {city} in {month} because my partner got a transfer",
            "when and where are we moving ?",
        ),
        (f"my doctor said i am allergic to {allergy} , so i need to be careful", "what am i allergic to ?"),
        (
            f"my favourite restaurant is a small {food} place called {name}'s kitchen",
            "what is my favourite restaurant ?",
        ),
        (
            f"i lent {k}00 dollars to my cousin {name} , he will pay it back in {month}",
            "how much did i lend my cousin ?",
        ),
        (
            f"our anniversary is on the {k}th of {month} , we met at a {hobby} class",
            "when is our anniversary ?",
        ),
    )
    return rng.choice(facts)


def build_chat(data: Path, file: str, seed: int, turns: int, facts: int) -> Meeting:
    """Sessions of TIAGE dialogues up to ``turns`` turns, ``facts`` of them with a planted fact."""
    rng = random.Random(seed)
    dialogues = json.loads((data / "tiage" / file).read_text(encoding="utf-8"))
    sessions: list[list[str]] = []
    for dialogue in dialogues.values():
        sessions.append([str(text) for text, _label in dialogue])
        if sum(len(s) for s in sessions) >= turns:
            break
    planted = set(rng.sample(range(1, len(sessions) - 1), min(facts, len(sessions) - 2)))
    out: list[Turn] = []
    queries: list[Query] = []
    at = START
    for i, lines in enumerate(sessions):
        at += timedelta(hours=rng.randint(*SESSION_GAP_HOURS))
        said: tuple[str, str] | None = None
        if i in planted:
            said = fact(rng)
            at_turn = rng.randrange(0, len(lines) // 2) * 2  # a user turn
            lines = [*lines[:at_turn], said[0], "got it , i will keep that in mind .", *lines[at_turn:]]
        for j, text in enumerate(lines):
            at += timedelta(seconds=rng.randint(*CHAT_TURN_SECONDS))
            role = "user" if j % 2 == 0 else "assistant"
            index = len(out)
            out.append(Turn(index, index + 1, role, "", text, at, role))
            if said is not None and text == said[0]:
                queries.append(Query(said[1], (index,), frozenset(content_words(text))))
    return Meeting(f"chat-{Path(file).stem}-{seed}", "chat", tuple(out), tuple(queries), 0, 0)


def run_chat(args: tuple[Path, str, int, int, int, tuple[int, ...]]) -> MeetingResult:
    data, file, seed, turns, facts, budgets = args
    chat = build_chat(data, file, seed, turns, facts)
    return asyncio.run(run_loaded(chat, budgets, ("static", "query")))


def render(results: Sequence[MeetingResult], budgets: Sequence[int], command: str) -> str:
    systems = list(results[0].budgets[budgets[0]].query) + [
        s for s in results[0].budgets[budgets[0]].static if s not in results[0].budgets[budgets[0]].query
    ]
    rows = []
    for name in systems:
        row: list[object] = [name]
        for kind in ("query", "static"):
            for b in budgets:
                values = [v for r in results for v in getattr(r.budgets[b], kind).get(name, [])]
                row.append(f"{100 * statistics.mean(values):.1f}" if values else "–")
        rows.append(row)
    headers = ["system"] + [f"query {b:,}" for b in budgets] + [f"static {b:,}" for b in budgets]
    n_facts = sum(r.queries for r in results)
    turns = sum(r.messages for r in results)
    return "\n".join(
        [
            f"`{command}` on {machine()}; revision {git_revision()}.",
            "",
            f"{len(results)} chats, {turns:,} turns in all ({turns // len(results):,} each, about "
            f"{turns // len(results) // 16} sessions), {n_facts} planted facts. Retention (%) of each "
            "fact's content words: asked about as the newest user message (query), and in the context "
            "read at the end of the chat (static).",
            "",
            table(headers, rows),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--budgets", default="1000,2000,4000")
    p.add_argument("--turns", type=int, default=800, help="turns of each chat")
    p.add_argument("--facts", type=int, default=24, help="planted facts in each chat")
    p.add_argument("--chats", type=int, default=len(CHATS), help="how many of the chats to run")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    budgets = tuple(int(b) for b in args.budgets.split(","))
    jobs = [(args.data, file, seed, args.turns, args.facts, budgets) for file, seed in CHATS[: args.chats]]
    log(f"chat facts: {len(jobs)} chats of {args.turns} turns, budgets {budgets}")
    with ProcessPoolExecutor(args.jobs) as ex:
        results = list(ex.map(run_chat, jobs))
    # Options that change the figures, as given when not their defaults.
    command = "python -m bench.chat_facts" + "".join(
        f" --{name} {getattr(args, name)}"
        for name in ("budgets", "turns", "facts", "chats")
        if getattr(args, name) != p.get_default(name)
    )
    md = render(results, budgets, command)
    if args.out:
        update_section(args.out, "chat_facts", md)
    else:
        print(md)


if __name__ == "__main__":
    main()
