"""``tiered-history``: a thin command line over :class:`~tiered_history.SyncHistoryCompressor`.

Every command opens the store named by ``--database-url`` (or ``TIERED_HISTORY_DATABASE_URL``,
or ``database_url`` in the config file, or a SQLite file in the user data directory),
calls one library method and prints the result: rich tables for people, ``--json`` for
programs. Errors are one line on stderr: exit 1 for library, database and input-file
errors, 2 for usage errors, 130 when interrupted. Never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from . import (
    CompressedContext,
    ConfigurationError,
    ConversationNotFoundError,
    ConversationStats,
    History,
    HistoryCompressor,
    Settings,
    StoredMessage,
    Summary,
    SyncHistoryCompressor,
    TieredHistoryError,
)
from .core.budget import MIN_MAX_TOKENS
from .database import (
    mask_url,
    newer_schema,
    optimize_database,
    require_current_schema,
    schema_revision,
    upgrade_schema,
)
from .errors import SchemaError, TranscriptError
from .exchange import is_export, read_export
from .transcripts import IMPORT_KEY as IMPORT_KEY  # re-exported: the CLI documents this key
from .transcripts import ImportResult, TranscriptEntry, import_entries, read_transcript

#: Conversation id the ``demo`` command replays the bundled sample into.
DEMO_CONVERSATION = "demo"

_TIER_STYLE = {"current": "green", "topic": "cyan", "bulk": "magenta"}
_TIER_LABEL = {"current": "current topic", "topic": "topic summaries", "bulk": "bulk archives"}

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


#: Click's exception classes as typer uses them (typer >= 0.22 vendors its own copy of click).
_cx: Any = sys.modules[typer.BadParameter.__module__]


# -- error handling: one line on stderr, no traceback ---------------------------------------------


def _fail(message: str, code: int) -> None:
    line = " ".join(str(message).split()) or "failed"
    typer.echo(f"error: {line}", err=True)
    sys.exit(code)


class _Group(TyperGroup):
    """The root command group: turns every failure into one line on stderr and an exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except getattr(_cx, "NoArgsIsHelpError", ()):
            sys.exit(2)  # the help was printed already
        except _cx.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            _fail(exc.format_message() + hint, 2)
        except typer.Abort:
            _fail("aborted", 130)
        except _cx.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except TieredHistoryError as exc:
            _fail(str(exc), 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # a bug: still one line, never a traceback
            _fail(f"unexpected {type(exc).__name__}: {exc}", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
    name="tiered-history",
    help="Keep long chatbot conversations inside an LLM context window: inspect, import, maintain.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(
    help="Database schema migrations (Alembic) and index upkeep.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(db_app, name="db")


# -- global options -----------------------------------------------------------------------------


def default_database_url(create: bool = True) -> str:
    """``sqlite:///<user data dir>/tiered-history/history.db``; the directory is created if missing."""
    import platformdirs

    folder = Path(platformdirs.user_data_dir("tiered-history", appauthor=False))
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'history.db'}"


@dataclass
class _Options:
    database_url: str | None = None
    config: Path | None = None
    _settings: Settings | None = field(default=None, repr=False)

    def settings(self, **overrides: Any) -> Settings:
        if overrides:
            return Settings.load(self.config, **overrides)
        if self._settings is None:
            self._settings = Settings.load(self.config)
        return self._settings

    def url(self, settings: Settings) -> str:
        return self.database_url or settings.database_url or default_database_url()


def _opts(ctx: typer.Context) -> _Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, _Options) else _Options()


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"tiered-history {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="TIERED_HISTORY_DATABASE_URL",
            help="sqlite:///path.db, postgresql://user@host/db or memory://. "
            "Default: database_url from the config file, else history.db in the user data directory.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="TIERED_HISTORY_CONFIG",
            help="YAML settings file (see config.example.yaml).",
            dir_okay=False,
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Keep long chatbot conversations inside an LLM context window: inspect, import, maintain."""
    ctx.obj = _Options(database_url=database_url or None, config=config)


def _in_process_only(url: str) -> bool:
    """True for a database that ends with the process (``memory://``, in-memory SQLite)."""
    if url.startswith("memory://"):
        return True
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return False  # reported as an invalid URL when opened
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


@contextlib.contextmanager
def _open(
    ctx: typer.Context, url: str | None = None, *, stores: bool = False, **overrides: Any
) -> Iterator[SyncHistoryCompressor]:
    """The compressor for the command; ``stores``: the command's point is to store something."""
    opts = _opts(ctx)
    settings = opts.settings(**overrides)
    url = url or opts.url(settings)
    if stores and _in_process_only(url):
        raise ConfigurationError(
            f"{_mask(url)} keeps nothing once this command exits: give --database-url a SQLite file "
            "or PostgreSQL database"
        )
    compressor = SyncHistoryCompressor(url, settings=settings)
    try:
        compressor.initialize()
        yield compressor
    finally:
        compressor.close()


def _require(compressor: SyncHistoryCompressor, conversation_id: str) -> ConversationStats:
    """Stats of one conversation; raises :class:`ConversationNotFoundError` if it was never stored."""
    found = compressor.stats(conversation_id)
    if not found:
        raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
    return found[0]


# -- output helpers -----------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, default=_json_default, ensure_ascii=False, indent=2))


def _abbrev(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _when(ts: datetime | None) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _mask(url: str) -> str:
    return mask_url(url)


def _message_text(m: StoredMessage, width: int) -> str:
    if m.tool_calls:
        calls = ", ".join(str(c.get("function", {}).get("name", "?")) for c in m.tool_calls)
        return _abbrev(f"[tool call: {calls}] {m.content}".strip(), width)
    return _abbrev(m.context_content, width)


def _messages_table(title: str, messages: Sequence[StoredMessage], width: int = 70, limit: int = 0) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("role")
    table.add_column("content", overflow="fold")
    table.add_column("tokens", justify="right")
    shown: list[StoredMessage | None] = list(messages)
    if limit and len(messages) > limit:
        head = max(limit // 3, 1)
        shown = [*messages[:head], None, *messages[-(limit - head) :]]
    for m in shown:
        if m is None:
            table.add_row("", "", "", f"… {len(messages) - limit} more messages …", "", style="dim")
            continue
        role = m.role + (" (pinned)" if m.pinned else "") + (f" ({m.name})" if m.name else "")
        table.add_row(str(m.sequence), _when(m.timestamp), role, _message_text(m, width), str(m.token_count))
    return table


def _summaries_table(title: str, summaries: Sequence[Summary], width: int = 70) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("messages", no_wrap=True)
    table.add_column("status")
    table.add_column("summary", overflow="fold")
    table.add_column("tokens", justify="right")
    for s in summaries:
        status = s.status + (" (dropped)" if s.dropped_at else "") + (" (merged)" if s.merged_into else "")
        table.add_row(
            str(s.sequence),
            f"{s.first_sequence}–{s.last_sequence}",
            status,
            _abbrev(s.content or "(pending)", width),
            str(s.token_count),
        )
    return table


def show_context(ctx: CompressedContext, console: Console | None = None, limit: int = 12) -> None:
    """Print each tier of a context (abbreviated) and its token split against the allocation."""
    console = console or out
    if ctx.pinned:
        console.print(_messages_table(f"Pinned ({len(ctx.pinned)})", ctx.pinned))
    console.print(_summaries_table(f"Bulk archives ({len(ctx.bulk_archives)})", ctx.bulk_archives))
    console.print(_summaries_table(f"Topic summaries ({len(ctx.historical_topics)})", ctx.historical_topics))
    if ctx.recent_topics:
        title = f"Recent topics, word for word instead of summarised ({len(ctx.recent_topics)} messages)"
        console.print(_messages_table(title, ctx.recent_topics, limit=limit))
    console.print(
        _messages_table(f"Current topic ({len(ctx.current_topic)} messages)", ctx.current_topic, limit=limit)
    )
    if ctx.omitted_messages:
        console.print(
            f"[dim]{ctx.omitted_messages} older messages of the current topic did not fit "
            "(they are still stored).[/dim]"
        )
    split = Table(title="Token split", title_justify="left", show_edge=False, pad_edge=False)
    split.add_column("tier")
    split.add_column("used", justify="right")
    split.add_column("allocated", justify="right")
    split.add_column("share", justify="right")
    budget = sum(ctx.allocation.values()) or 1
    split.add_row("pinned", str(ctx.tier_tokens.get("pinned", 0)), "-", "-")
    for key in ("current", "topic", "bulk"):
        alloc = ctx.allocation.get(key, 0)
        split.add_row(
            Text(_TIER_LABEL[key], style=_TIER_STYLE[key]),
            str(ctx.tier_tokens.get(key, 0)),
            str(alloc),
            f"{alloc / budget:.0%}",
        )
    if ctx.tier_tokens.get("recent"):
        split.add_row("recent topics (spare room)", str(ctx.tier_tokens["recent"]), "-", "-")
    split.add_row("framing", str(ctx.tier_tokens.get("framing", 0)), "-", "-")
    split.add_row(
        Text("total", style="bold"), Text(str(ctx.total_tokens), style="bold"), str(ctx.max_tokens), ""
    )
    console.print(split)
    console.print(
        f"[bold]{ctx.total_tokens}[/bold] of {ctx.max_tokens} tokens; compression ratio "
        f"[bold]{ctx.compression_ratio:.1f}x[/bold] (tokens of the original messages represented "
        "per token sent)"
    )


def _context_json(ctx: CompressedContext) -> dict[str, Any]:
    return {
        "conversation_id": ctx.conversation_id,
        "max_tokens": ctx.max_tokens,
        "total_tokens": ctx.total_tokens,
        "compression_ratio": ctx.compression_ratio,
        "tier_tokens": ctx.tier_tokens,
        "allocation": ctx.allocation,
        "omitted_messages": ctx.omitted_messages,
        "truncated_newest": ctx.truncated_newest,
        "counts": {
            "pinned": len(ctx.pinned),
            "bulk_archives": len(ctx.bulk_archives),
            "historical_topics": len(ctx.historical_topics),
            "recent_topics": len(ctx.recent_topics),
            "current_topic": len(ctx.current_topic),
        },
        "messages": ctx.to_messages(),
    }


def usage_bar(stats: ConversationStats, settings: Settings, width: int = 48) -> Text:
    """A bar split by the tier shares of ``context_budget``, each part filled by that tier's tokens."""
    shares = {
        "current": settings.tiers.current_topic,
        "topic": settings.tiers.topic_summaries,
        "bulk": settings.tiers.bulk_archives,
    }
    bar = Text("▕")
    for key, share in shares.items():
        cells = round(width * share)
        alloc = settings.context_budget * share
        used = stats.tier_tokens.get(key, 0)
        filled = cells if alloc <= 0 else min(cells, round(cells * used / alloc))
        style = _TIER_STYLE[key] + (" bold" if alloc and used > alloc else "")
        bar.append("█" * filled, style=style)
        bar.append("░" * (cells - filled), style="dim " + _TIER_STYLE[key])
    bar.append("▏")
    return bar


def _show_stats(stats: Sequence[ConversationStats], settings: Settings) -> None:
    budget = settings.context_budget
    shares = {
        "current": settings.tiers.current_topic,
        "topic": settings.tiers.topic_summaries,
        "bulk": settings.tiers.bulk_archives,
    }
    for s in stats:
        out.print(
            f"[bold]{s.conversation_id}[/bold]"
            + (f" [dim]({s.platform})[/dim]" if s.platform else "")
            + f"  {s.messages} messages, {s.message_tokens} tokens stored"
        )
        out.print(Text("  ").append(usage_bar(s, settings)))
        parts = Text("  ")
        for key, share in shares.items():
            used = s.tier_tokens.get(key, 0)
            alloc = int(budget * share)
            parts.append(f"{_TIER_LABEL[key]} ", style=_TIER_STYLE[key])
            parts.append(f"{used}/{alloc}", style="bold red" if used > alloc else "")
            parts.append("   ")
        out.print(parts)
        out.print(
            f"  topics {s.topics} ({s.topics_pending} pending) · archives {s.archives} "
            f"({s.archives_dropped} dropped) · provisional {s.summaries_provisional} · compressions "
            f"{s.compressions} · summariser "
            f"{s.summarizer_prompt_tokens}+{s.summarizer_completion_tokens} tokens, ${s.summarizer_cost:.4f}"
        )
    out.print(f"[dim]Bars: each tier's stored tokens against its share of context_budget={budget}.[/dim]")


# -- transcripts (import and demo) ----------------------------------------------------------------


def _import(
    compressor: SyncHistoryCompressor, entries: Sequence[TranscriptEntry], platform: str | None = None
) -> ImportResult:
    """:func:`~tiered_history.transcripts.import_entries` with a progress bar on stderr."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # Only on a terminal: written to a file or a pipe, a bar is noise (rich ends it with a newline).
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("importing", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return import_entries(compressor, entries, platform, advance)


# -- commands -----------------------------------------------------------------------------------


class Role(StrEnum):
    system = "system"
    user = "user"
    assistant = "assistant"
    tool = "tool"


ConversationArg = Annotated[str, typer.Argument(help="Conversation id.", show_default=False, metavar="CONV")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for programs instead of tables.")]


@app.command()
def demo(
    ctx: typer.Context,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=200, help="Context budget to compress the sample into.")
    ] = 2000,
) -> None:
    """Replay a bundled sample conversation offline and show how it is compressed (no API key needed).

    Uses a temporary SQLite file unless --database-url (or TIERED_HISTORY_DATABASE_URL) is given,
    the offline extractive summariser, and context_budget = --max-tokens.
    """
    started = time.perf_counter()
    sample = resources.files("tiered_history") / "data" / "sample_conversation.jsonl"
    with resources.as_file(sample) as path:
        entries = read_transcript(path)
    # Shift the sample so that it ends two minutes ago: the open topic is not yet silent.
    shift = datetime.now(UTC) - timedelta(minutes=2) - max(e.message.timestamp for e in entries)
    entries = [
        dataclasses.replace(
            e, message=e.message.model_copy(update={"timestamp": e.message.timestamp + shift})
        )
        for e in entries
    ]
    overrides: dict[str, Any] = {"context_budget": max_tokens, "summarizer": {"kind": "extractive"}}
    explicit = _opts(ctx).database_url
    with contextlib.ExitStack() as stack:
        if explicit:
            url = explicit
        else:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="tiered-history-demo-"))
            url = f"sqlite:///{Path(folder) / 'demo.db'}"
        compressor = stack.enter_context(_open(ctx, url, **overrides))
        result = _import(compressor, entries)
        report = compressor.maintain(DEMO_CONVERSATION)
        compressed = compressor.get_context(DEMO_CONVERSATION, max_tokens)
        stats = _require(compressor, DEMO_CONVERSATION)
        history = compressor.get_history(DEMO_CONVERSATION)
    out.rule("[bold]tiered-history demo[/bold]")
    out.print(
        f"Replayed {result.imported} messages ({result.skipped} already there) of a "
        f"{len(history.messages)}-message conversation: {stats.message_tokens} tokens stored, "
        f"{len(history.topics)} topics sealed ({', '.join(_reasons(history))})."
    )
    out.print(
        f"Maintenance: {report.sealed} sealed, {report.summarized} topics summarised, "
        f"{report.merged} bulk merges, {report.dropped} archives dropped from the context "
        "(nothing is deleted)."
    )
    out.print(f"Database: {_mask(url) if explicit else 'temporary SQLite file (removed)'}\n")
    show_context(compressed)
    out.print(f"[dim]Finished in {time.perf_counter() - started:.1f} s.[/dim]")


def _reasons(history: History) -> list[str]:
    counts: dict[str, int] = {}
    for t in history.topics:
        reason = t.sealed_reason or "?"
        counts[reason] = counts.get(reason, 0) + 1
    return [f"{n} {r}" for r, n in sorted(counts.items())] or ["none"]


@app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(help="JSON or JSONL transcript.", show_default=False, dir_okay=False, metavar="FILE"),
    ],
    conversation: Annotated[
        str | None,
        typer.Option(
            "--conversation",
            "-c",
            help="Conversation id (required for a plain JSON list; overrides ids in the file).",
        ),
    ] = None,
    platform: Annotated[str | None, typer.Option(help="Platform recorded with new conversations.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import a transcript; re-running it skips messages already imported.

    Formats: a JSON list of OpenAI-style messages (with --conversation), a JSON object
    {"conversation_id": ..., "messages": [...]}, or JSONL with one message object per line,
    each with a "conversation_id". Each message gets metadata.import_key, a hash of its position
    in its conversation within the file and of its content; messages whose key is already
    stored in that conversation are skipped.

    A file written by 'tiered-history export' is restored whole instead (messages, pins, metadata,
    summaries), under --conversation if given, in one transaction; re-running it changes nothing,
    and an existing conversation with other content is refused.
    """
    if is_export(_first_line(file)):
        if platform is not None:
            raise typer.BadParameter(
                "an exported conversation carries its own platform", param_hint="--platform"
            )
        result = _import_export(ctx, file, conversation)
    else:
        entries = read_transcript(file, conversation)
        with _open(ctx, stores=True) as compressor:
            result = _import(compressor, entries, platform)
    if as_json:
        _print_json(dataclasses.asdict(result))
        return
    out.print(
        f"Imported {_count(result.imported, 'message')} into "
        f"{_count(len(result.conversations), 'conversation')}; skipped {result.skipped} already imported."
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _strip_final_newline(text: str) -> str:
    for end in ("\r\n", "\n", "\r"):
        if text.endswith(end):
            return text[: -len(end)]
    return text


def _first_line(file: Path) -> str:
    """The first non-blank line of ``file`` ("" if it cannot be read: the reader says why)."""
    try:
        with file.open(encoding="utf-8") as lines:
            return next((line for line in lines if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return ""


def _import_export(ctx: typer.Context, file: Path, conversation: str | None) -> ImportResult:
    """Restore a file written by ``export``; reported like a transcript import."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TranscriptError(f"cannot read {file}: {exc}") from None
    target = conversation or read_export(text).conversation_id
    with _open(ctx, stores=True) as compressor:
        existed = compressor.exists(target)
        info = compressor.import_conversation(text, conversation_id=conversation)
    done = 0 if existed else info.messages
    return ImportResult(
        imported=done, skipped=info.messages - done, conversations={info.conversation_id: done}
    )


@app.command()
def add(
    ctx: typer.Context,
    conversation_id: ConversationArg,
    content: Annotated[
        str | None,
        typer.Option("--content", help="Message text ('-' reads standard input).", show_default=False),
    ] = None,
    role: Annotated[
        Role | None,
        typer.Option("--role", help="Who wrote the message (default: user; assistant with --tool-call)."),
    ] = None,
    tool_call: Annotated[
        list[str] | None,
        typer.Option(
            "--tool-call",
            metavar="NAME=JSON",
            help="An assistant tool call: the function name, '=', its arguments as JSON, e.g. "
            '--tool-call \'get_weather={"city": "Paris"}\'. Repeat for parallel calls; --content '
            "is then optional. Then store each result with --role tool --tool-call-id ID.",
            show_default=False,
        ),
    ] = None,
    tool_call_id: Annotated[
        list[str] | None,
        typer.Option(
            "--tool-call-id",
            help="With --role tool: the id of the call answered. With --tool-call: the ids of the calls, "
            "in order (default: generated and printed).",
            show_default=False,
        ),
    ] = None,
    message_json: Annotated[
        str | None,
        typer.Option(
            "--message",
            metavar="JSON",
            help="A whole OpenAI-format message as JSON ('-' reads standard input), stored exactly as "
            "given: what a bot logged, tool_calls, content parts and provider fields included. "
            "Replaces --content, --role, --name, --tool-call and --tool-call-id.",
            show_default=False,
        ),
    ] = None,
    pinned: Annotated[bool, typer.Option("--pinned", help="Always send this message verbatim.")] = False,
    pin_key: Annotated[
        str | None,
        typer.Option(
            "--pin-key",
            help="Pin under this key (implies --pinned): pinning again under the same key replaces it, "
            "e.g. --pin-key system for a system prompt.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Participant name (OpenAI 'name').")] = None,
    platform: Annotated[str | None, typer.Option(help="Platform of a new conversation.")] = None,
    channel: Annotated[
        str | None, typer.Option(help="Channel, thread or chat id of a new conversation.")
    ] = None,
    user_id: Annotated[
        str | None, typer.Option("--user-id", help="Platform id of the user who wrote it.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Add one message to a conversation (creating it if new): text, an assistant tool call, a tool
    result, or a whole OpenAI-format message with --message."""
    message = _message_from_options(content, role, tool_call, tool_call_id, message_json, name)
    if pinned or pin_key is not None:
        message["pinned"] = True
    with _open(ctx, stores=True) as compressor:
        if pin_key is not None:
            stored = compressor.pin(conversation_id, message, key=pin_key, platform=platform, channel=channel)
        else:
            stored = compressor.add_message(
                conversation_id, message, platform=platform, channel=channel, user_id=user_id
            )
    if as_json:
        _print_json(stored)
        return
    out.print(f"Added message #{stored.sequence} to {conversation_id!r} ({stored.token_count} tokens).")
    for call in stored.tool_calls or ():
        fn = call.get("function") or {}
        out.print(
            f"  tool call {call.get('id')} ({fn.get('name', '?')}): store its result with "
            f"--role tool --tool-call-id {call.get('id')}"
        )


def _read_arg(value: str) -> str:
    # Like the shell's $(...): the newline that ends the input is not part of the message.
    return _strip_final_newline(sys.stdin.read()) if value == "-" else value


def _message_from_options(
    content: str | None,
    role: Role | None,
    tool_call: list[str] | None,
    tool_call_id: list[str] | None,
    message_json: str | None,
    name: str | None,
) -> dict[str, Any]:
    """The message ``add``'s options describe (the library checks it; here only their combination)."""
    ids = tool_call_id or []
    if message_json is not None:
        if any(v is not None for v in (content, role, tool_call, tool_call_id, name)):
            raise typer.BadParameter(
                "--message holds the whole message: drop --content, --role, --name and the tool options",
                param_hint="--message",
            )
        try:
            message = json.loads(_read_arg(message_json))
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--message") from None
        if not isinstance(message, dict):
            raise typer.BadParameter("must be a JSON object", param_hint="--message")
        return message
    if content is None and not tool_call:
        raise typer.BadParameter("give --content, --tool-call or --message", param_hint="--content")
    role = role or (Role.assistant if tool_call else Role.user)
    message = {"role": role.value, "content": None if content is None else _read_arg(content)}
    if name:
        message["name"] = name
    if tool_call:
        if role is not Role.assistant:
            raise typer.BadParameter("only assistant messages make tool calls", param_hint="--role")
        if ids and len(ids) != len(tool_call):
            raise typer.BadParameter(
                f"{len(ids)} ids for {len(tool_call)} calls: give one per --tool-call, or none",
                param_hint="--tool-call-id",
            )
        message["tool_calls"] = [
            _tool_call(spec, ids[i] if ids else f"call_{uuid.uuid4().hex[:24]}")
            for i, spec in enumerate(tool_call)
        ]
    elif ids:
        if len(ids) > 1:
            raise typer.BadParameter("a tool result answers one call", param_hint="--tool-call-id")
        message["tool_call_id"] = ids[0]
    return message


def _tool_call(spec: str, call_id: str) -> dict[str, Any]:
    fn, sep, arguments = spec.partition("=")
    if not sep or not fn.strip():
        raise typer.BadParameter(f"{spec!r} is not NAME=JSON", param_hint="--tool-call")
    try:
        json.loads(arguments)
    except ValueError as exc:
        raise typer.BadParameter(
            f"the arguments of {fn!r} are not JSON: {exc}", param_hint="--tool-call"
        ) from None
    return {"id": call_id, "type": "function", "function": {"name": fn.strip(), "arguments": arguments}}


@app.command()
def context(
    ctx: typer.Context,
    conversation_id: ConversationArg,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            help=f"Token budget, at least {MIN_MAX_TOKENS} (default: the model's input window minus "
            "reserve_output_tokens, else context_budget).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what would be sent to the model now: every tier and the token split."""
    with _open(ctx) as compressor:
        compressed = compressor.get_context(conversation_id, max_tokens, record=False)
    if as_json:
        _print_json(_context_json(compressed))
    else:
        show_context(compressed)


@app.command()
def history(ctx: typer.Context, conversation_id: ConversationArg, as_json: JsonOpt = False) -> None:
    """Show everything stored for a conversation: messages, topic summaries and archives."""
    with _open(ctx) as compressor:
        hist = compressor.get_history(conversation_id)
    if as_json:
        _print_json(hist)
        return
    out.print(
        f"[bold]{hist.conversation_id}[/bold]"
        + (f" ({hist.platform})" if hist.platform else "")
        + f": {len(hist.messages)} messages, open topic starts at #{hist.open_topic_start}"
    )
    out.print(_messages_table("Messages", hist.messages))
    if hist.topics:
        out.print(_summaries_table("Topic summaries", hist.topics))
    if hist.archives:
        out.print(_summaries_table("Bulk archives", hist.archives))


@app.command()
def seal(ctx: typer.Context, conversation_id: ConversationArg) -> None:
    """Close the open topic now; the next maintenance summarises it."""
    with _open(ctx) as compressor:
        sealed = compressor.seal_current_topic(conversation_id)
    if sealed is None:
        out.print(f"Nothing to seal: the open topic of {conversation_id!r} is empty.")
    else:
        out.print(
            f"Sealed topic #{sealed.sequence} of {conversation_id!r} (messages "
            f"{sealed.first_sequence}–{sealed.last_sequence}); it is summarised by the next maintenance."
        )


@app.command()
def stats(
    ctx: typer.Context,
    conversation_id: Annotated[
        str | None,
        typer.Argument(help="Conversation id (default: all).", show_default=False, metavar="CONV"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show tier usage against the budget, compressions and summariser spend per conversation."""
    with _open(ctx) as compressor:
        rows = compressor.stats(conversation_id)
        settings = compressor.settings
    if conversation_id is not None and not rows:
        raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
    if as_json:
        _print_json([dataclasses.asdict(r) for r in rows])
    elif not rows:
        out.print("No conversations stored yet.")
    else:
        _show_stats(rows, settings)


@app.command()
def maintain(
    ctx: typer.Context,
    conversation_id: Annotated[
        str | None,
        typer.Argument(
            help="Conversation id (default: all that need it).", show_default=False, metavar="CONV"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Do pending compression work now: seal silent topics, summarise, merge, drop."""
    with _open(ctx) as compressor:
        if conversation_id is not None:
            _require(compressor, conversation_id)
        report = compressor.maintain(conversation_id)
    if as_json:
        _print_json(report)
        return
    out.print(
        f"{report.conversations} conversations: {report.sealed} sealed, {report.summarized} summarised "
        f"({report.provisional} provisional), {report.merged} merged, {report.dropped} dropped, "
        f"{report.lease_lost} leases lost."
    )
    for error in report.errors:
        err.print(f"[red]warning:[/red] {error}")


@app.command()
def search(
    ctx: typer.Context,
    conversation_id: ConversationArg,
    text: Annotated[
        str,
        typer.Argument(
            help="Words to look for (case-insensitive; a piece like NEEDLE-4711 is a phrase).",
            show_default=False,
            metavar="TEXT",
        ),
    ],
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Most results to show.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Find the stored messages that best match TEXT: BM25 over its words, best first (newest
    first on equal scores); text with no word at all is matched literally."""
    with _open(ctx) as compressor:
        _require(compressor, conversation_id)
        found = compressor.search(conversation_id, text, limit)
    if as_json:
        _print_json([{**dataclasses.asdict(h.message), "score": h.score} for h in found])
    elif not found:
        out.print(f"No message of {conversation_id!r} matches {text!r}.")
    else:
        out.print(_messages_table(f"{len(found)} matches", [h.message for h in found], width=100))


@app.command()
def conversations(
    ctx: typer.Context,
    platform: Annotated[str | None, typer.Option(help="Only this platform.")] = None,
    channel: Annotated[str | None, typer.Option(help="Only this channel, thread or chat id.")] = None,
    user_id: Annotated[str | None, typer.Option("--user-id", help="Only those this user wrote in.")] = None,
    active_since: Annotated[
        str | None,
        typer.Option(
            "--active-since",
            metavar="WHEN",
            help="Only those with a message since WHEN: an ISO 8601 time with an offset, or an age "
            "such as 30m, 12h, 7d.",
            show_default=False,
        ),
    ] = None,
    after: Annotated[
        str | None, typer.Option(help="Start after this conversation id (for paging).", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Most conversations to list.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """List conversations in id order with their platform, channel, users, creation and last activity."""
    since = _since(active_since) if active_since is not None else None
    with _open(ctx) as compressor:
        found = compressor.list_conversations(
            platform=platform, channel=channel, user_id=user_id, active_since=since, after=after, limit=limit
        )
    if as_json:
        _print_json(found)
        return
    if not found:
        out.print(
            "No conversations match."
            if any((platform, channel, user_id, since, after))
            else "No conversations stored yet."
        )
        return
    # Ids, places and counts never wrap (they are copied into other commands); users may. Topic,
    # archive and pin counts are in --json (a terminal is too narrow for them all).
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("conversation", no_wrap=True)
    table.add_column("platform", no_wrap=True)
    table.add_column("channel", no_wrap=True)
    table.add_column("users", overflow="fold", min_width=8)
    table.add_column("created", no_wrap=True)
    table.add_column("last active", no_wrap=True)
    table.add_column("msgs", justify="right", no_wrap=True)
    for c in found:
        table.add_row(
            c.conversation_id,
            c.platform or "-",
            c.channel or "-",
            ", ".join(c.users) or "-",
            c.created_at.astimezone(UTC).strftime("%Y-%m-%d") if c.created_at else "-",
            _when(c.last_active_at),
            str(c.messages),
        )
    out.print(table)
    if len(found) == limit:
        out.print(f"[dim]More may follow: --after {found[-1].conversation_id}[/dim]")


def _since(value: str) -> datetime:
    """``--active-since``: an aware ISO 8601 time, or an age (``30m``, ``12h``, ``7d``) before now."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = value.strip()
    if text[-1:] in units and text[:-1].isdigit():
        return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither an ISO 8601 time nor an age like 7d", param_hint="--active-since"
        ) from None
    if when.utcoffset() is None:
        raise typer.BadParameter(
            "give the time with its offset, e.g. 2025-01-31T00:00:00Z", param_hint="--active-since"
        )
    return when


@app.command()
def delete(
    ctx: typer.Context,
    conversation_id: ConversationArg,
    yes: Annotated[
        bool,
        typer.Option("--yes", help="Confirm: every message, summary and archive of it is removed for good."),
    ] = False,
) -> None:
    """Delete one conversation and everything stored for it (for privacy requests); needs --yes."""
    if not yes:
        raise typer.BadParameter(
            f"deleting {conversation_id!r} removes all it holds for good; add --yes to confirm",
            param_hint="--yes",
        )
    with _open(ctx) as compressor:
        if not compressor.delete_conversation(conversation_id):
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
    out.print(f"Deleted conversation {conversation_id!r}.")


@app.command()
def export(
    ctx: typer.Context,
    conversation_id: ConversationArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="File to write (default: standard output).",
            show_default=False,
        ),
    ] = None,
    summaries: Annotated[
        bool,
        typer.Option(
            "--summaries/--no-summaries",
            help="Include topic summaries and archives (without them, an import finds the topics "
            "again and maintenance summarises them).",
        ),
    ] = True,
) -> None:
    """Export a conversation as JSONL: every message exactly as stored, its pins, metadata, times and
    summaries. 'tiered-history import FILE' restores it, here or in another database."""
    with _open(ctx) as compressor:
        text = compressor.export_conversation(conversation_id, summaries=summaries)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise TieredHistoryError(f"cannot write {output}: {exc}") from None
    lines = text.count("\n")
    err.print(f"Exported {conversation_id!r} to {output} ({lines} lines).")


@app.command()
def worker(
    ctx: typer.Context,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            min=0.01,
            help="Seconds between maintenance passes (default: maintenance_interval_seconds).",
        ),
    ] = None,
    detector: Annotated[
        list[str] | None,
        typer.Option(
            "--detector",
            metavar="MODULE:NAME",
            help="A pluggable boundary detector for the passes to ask: a BoundaryDetector object, "
            "or a class or function returning one, importable as MODULE:NAME (repeatable).",
        ),
    ] = None,
) -> None:
    """Run background maintenance until stopped (Ctrl+C or SIGTERM shut it down cleanly)."""
    opts = _opts(ctx)
    settings = opts.settings()
    url = opts.url(settings)
    seconds = interval or settings.maintenance_interval_seconds
    detectors = [_load_detector(spec) for spec in detector or ()]
    compressor = HistoryCompressor(url, settings=settings, detectors=detectors)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("tiered_history")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        asyncio.run(_run_worker(compressor, seconds, _mask(url)))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    out.print("Worker stopped.")


def _load_detector(spec: str) -> Any:
    """``MODULE:NAME`` → the detector object (a class or a function named there is called once)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"{spec!r} is not MODULE:NAME", param_hint="--detector")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise typer.BadParameter(f"cannot load {spec!r}: {exc}", param_hint="--detector") from None
    # An instance has ``propose``; a class or a factory is called to make one.
    return found if hasattr(found, "propose") and not isinstance(found, type) else found()


async def _run_worker(compressor: HistoryCompressor, interval: float, where: str) -> None:
    from .scheduler import run_worker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows or not the main thread
            pass
    try:
        async with compressor:
            out.print(
                f"Worker {compressor.worker_id} running maintenance every {interval:g} s on {where}; "
                "Ctrl+C or SIGTERM stops it.",
                soft_wrap=True,
            )
            sys.stdout.flush()
            await run_worker(compressor, interval, stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; anything but loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8750,
    allow_writes: Annotated[
        bool,
        typer.Option("--allow-writes", help="Enable the actions: seal the topic, run maintenance, delete."),
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="TIERED_HISTORY_WEB_TOKEN",
            help="Secret every request must carry (header, or the login form's cookie); "
            "required off loopback, at least 16 characters.",
            show_default=False,
        ),
    ] = None,
    secure_cookies: Annotated[
        bool,
        typer.Option(
            "--secure-cookies",
            help="Mark its cookies Secure: for a TLS-terminating proxy in front (it sees plain HTTP).",
        ),
    ] = False,
) -> None:
    """Serve the web inspector: what the model sees, the timeline, search (needs the web extra).

    Read-only unless --allow-writes; a read-only inspector refuses a database whose schema is not
    current instead of migrating it (run 'tiered-history db upgrade').
    """
    _serve(ctx, host, port, allow_writes, token or None, secure_cookies)


def _serve(
    ctx: typer.Context, host: str, port: int, allow_writes: bool, token: str | None, secure_cookies: bool
) -> None:
    try:
        import uvicorn

        from .web import create_app, hosts_for, is_loopback
    except ImportError as exc:  # the web extra is not installed
        hint = 'the web inspector needs its extra: pip install "tiered-history[web]"'
        raise TieredHistoryError(str(exc) if hint in str(exc) else f"{hint} ({exc})") from None
    if token is not None and len(token) < 16:
        raise typer.BadParameter(
            "use at least 16 characters (e.g. from 'openssl rand -hex 16')", param_hint="--token"
        )
    if token is None and not is_loopback(host):
        raise typer.BadParameter(
            f"listening on {host} needs --token (or TIERED_HISTORY_WEB_TOKEN): anyone who can reach it "
            "could read every conversation",
            param_hint="--host",
        )
    opts = _opts(ctx)
    settings = opts.settings()
    url = opts.url(settings)
    if not allow_writes:
        _check_schema_readonly(url)
    app_ = create_app(
        url,
        settings=settings,
        allow_writes=allow_writes,
        token=token,
        allowed_hosts=hosts_for(host),
        database=_mask(url),
        secure_cookies=secure_cookies,
    )
    shown = f"[{host}]" if ":" in host else host
    out.print(
        f"Inspector on http://{shown}:{port}/ for {_mask(url)}, "
        + ("writes ON (seal, maintain, delete)" if allow_writes else "read-only")
        + (", token required" if token else "")
        + "; Ctrl+C stops it.",
        soft_wrap=True,
    )
    config = uvicorn.Config(
        app_,
        host=host,
        port=port,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        access_log=False,
    )
    uvicorn.Server(config).run()


def _check_schema_readonly(url: str) -> None:
    """A read-only inspector must not create or migrate anything: the schema must be current."""
    if url.startswith("memory://"):
        return
    try:
        require_current_schema(url)
    except SchemaError as e:
        raise TieredHistoryError(
            f"{e} (without --allow-writes the inspector never changes the database)"
        ) from None


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context) -> None:
    """Create the schema or migrate it to the newest revision (Alembic head)."""
    url = _opts(ctx).url(_opts(ctx).settings())
    if url.startswith("memory://"):
        out.print("memory:// keeps no schema; nothing to upgrade.")
        return
    before, after, head = _migrate(url, upgrade=True)
    if before == after:
        out.print(f"{_mask(url)} is already at revision {after} (head).")
    else:
        out.print(f"Upgraded {_mask(url)} from {before or 'an empty database'} to revision {after} (head).")
    if after != head:
        raise TieredHistoryError(f"upgrade stopped at {after}, head is {head}")


@db_app.command("current")
def db_current(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show the schema revision of the database and whether it is at head (exit code 1 if not)."""
    url = _opts(ctx).url(_opts(ctx).settings())
    if url.startswith("memory://"):
        if as_json:
            _print_json({"database_url": url, "current": None, "head": None, "at_head": True})
        else:
            out.print("memory:// keeps no schema; nothing to migrate.")
        return
    current, _, head = _migrate(url, upgrade=False)
    at_head = current == head
    if as_json:
        _print_json({"database_url": _mask(url), "current": current, "head": head, "at_head": at_head})
    elif current is None:
        out.print(f"{_mask(url)}: no schema yet (head is {head}); run 'tiered-history db upgrade'.")
    elif at_head:
        out.print(f"{_mask(url)}: revision {current} (head).")
    elif (newer := newer_schema(current, head)) is not None:
        out.print(f"{_mask(url)}: {newer}.")
    else:
        out.print(f"{_mask(url)}: revision {current}, head is {head}; run 'tiered-history db upgrade'.")
    if not at_head:
        raise typer.Exit(1)  # scripts check the exit code: only a schema at head is "ok"


@db_app.command("optimize")
def db_optimize(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Compact the full-text indexes and refresh statistics (SQLite: FTS5 optimize, which holds
    the write lock while it runs; PostgreSQL: VACUUM ANALYZE). For a quiet hour."""
    url = _opts(ctx).url(_opts(ctx).settings())
    if url.startswith("memory://"):
        out.print("memory:// keeps no database; nothing to optimize.")
        return
    started = time.perf_counter()
    steps = optimize_database(url)
    seconds = round(time.perf_counter() - started, 3)
    if as_json:
        _print_json({"database_url": _mask(url), "steps": steps, "seconds": seconds})
    else:
        out.print(f"Optimized {_mask(url)} in {seconds} s: {'; '.join(steps)}.")


def _migrate(url: str, upgrade: bool) -> tuple[str | None, str | None, str]:
    """(revision before, revision after, head); runs the migrations when ``upgrade``."""
    if upgrade:
        return upgrade_schema(url)
    before, head = schema_revision(url)
    return before, before, head


def main() -> None:
    """Console-script entry point (``tiered-history``)."""
    app(prog_name="tiered-history")


if __name__ == "__main__":
    main()
