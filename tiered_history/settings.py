"""One settings model, read from keyword arguments, ``TIERED_HISTORY_*`` variables and a YAML file.

Precedence, highest first: keyword arguments, environment variables (nested keys
joined with ``__``, e.g. ``TIERED_HISTORY_TIERS__CURRENT_TOPIC=0.6``), the YAML
file (``config_file=`` or ``TIERED_HISTORY_CONFIG``), then the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .core.phrases import DEFAULT_PHRASES, phrases_for
from .errors import ConfigurationError

#: Every language with default trigger phrases (see :mod:`tiered_history.core.phrases`).
LANGUAGES: tuple[str, ...] = tuple(DEFAULT_PHRASES)
#: The trigger phrases used by default: those of every language above.
DEFAULT_TRIGGER_PHRASES: tuple[str, ...] = phrases_for()


_TRIGGER_ROLES: tuple[Literal["system", "user", "assistant", "tool"], ...] = ("user",)


class TierShares(BaseModel):
    """Shares of the budget for each tier; they must add up to 1."""

    model_config = ConfigDict(extra="forbid")

    current_topic: float = Field(0.50, ge=0.0, le=1.0)
    topic_summaries: float = Field(0.30, ge=0.0, le=1.0)
    bulk_archives: float = Field(0.20, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _sum_to_one(self) -> TierShares:
        total = self.current_topic + self.topic_summaries + self.bulk_archives
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"tier shares must add up to 1.0, they add up to {total:g}")
        return self


class BoundarySettings(BaseModel):
    """Which topic-boundary rules run when a message is added."""

    model_config = ConfigDict(extra="forbid")

    explicit: bool = True
    temporal: bool = True
    size: bool = True
    cohesion: bool = True
    unseal: bool = True
    languages: list[str] = Field(default_factory=lambda: list(LANGUAGES))
    trigger_phrases: list[str] = Field(default_factory=lambda: [])
    trigger_roles: list[Literal["system", "user", "assistant", "tool"]] = Field(
        default_factory=lambda: list(_TRIGGER_ROLES)
    )
    min_topic_tokens: int = Field(120, ge=0, le=1_000_000)
    detector_every: int = Field(4, ge=1, le=100_000)
    """Pluggable detectors (``HistoryCompressor(detectors=...)``) are asked about an open topic
    again once it holds this many new messages."""
    detector_timeout_seconds: float = Field(30.0, gt=0, le=3600)
    """A pluggable detector that has not answered by then is ignored for that pass."""

    @model_validator(mode="after")
    def _known_languages(self) -> BoundarySettings:
        unknown = [lang for lang in self.languages if lang not in DEFAULT_PHRASES]
        if unknown:
            raise ValueError(
                f"no default trigger phrases for {', '.join(unknown)} (known: {', '.join(LANGUAGES)}); "
                "give that language's phrases in trigger_phrases instead"
            )
        return self

    @property
    def phrases(self) -> tuple[str, ...]:
        """Every trigger phrase in force: the defaults of ``languages`` plus ``trigger_phrases``."""
        return phrases_for(self.languages, self.trigger_phrases)


class RecallSettings(BaseModel):
    """What ``get_context`` recalls for the newest message from earlier in the conversation."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    share: float = Field(0.4, ge=0.0, le=1.0)
    max_items: int = Field(16, ge=1, le=200)


class PlatformSettings(BaseModel):
    """Rules for the conversations of one platform (``add_message(platform=...)``): each key left
    out takes the global value."""

    model_config = ConfigDict(extra="forbid")

    silence_minutes: float | None = Field(None, gt=0, le=525_600)
    explicit: bool | None = None
    temporal: bool | None = None
    size: bool | None = None
    cohesion: bool | None = None
    languages: list[str] | None = None
    trigger_phrases: list[str] | None = None


class SummarizerSettings(BaseModel):
    """Which summariser writes topic summaries and bulk archives."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["extractive", "litellm"] = "extractive"
    model: str | None = None
    api_base: str | None = None
    api_key: str | None = None
    timeout: float = Field(30.0, gt=0, le=3600)
    """Seconds per request to the model (each retry and each chunk is a request)."""
    deadline: float = Field(300.0, gt=0, le=86_400)
    """Seconds for one whole summary: every request, retry and chunk of it."""
    max_retries: int = Field(0, ge=0, le=10)
    temperature: float = Field(0.0, ge=0.0, le=2.0)


class Settings(BaseModel):
    """Every knob of tiered-history. ``config.example.yaml`` documents each key.

    ``Settings(**values)`` fills what ``values`` leave out from the ``TIERED_HISTORY_*``
    variables, then the defaults; :meth:`load` reads the YAML file as well.
    """

    # A plain model, not pydantic-settings' BaseSettings: that package (and python-dotenv, which
    # it imports) cost about 30 ms of every start-up, and only our own reader of the environment
    # (_env_values) was ever used of it.
    model_config = ConfigDict(extra="forbid", validate_default=True)

    database_url: str | None = None
    model: str = "cl100k_base"
    context_budget: int = Field(8000, ge=200, le=10_000_000)
    reserve_output_tokens: int = Field(1024, ge=0, le=1_000_000)
    tiers: TierShares = Field(default_factory=lambda: TierShares())
    redistribute_unused: bool = True
    recall: RecallSettings = Field(default_factory=lambda: RecallSettings())
    window_step: float = Field(0.5, gt=0.0, le=1.0)
    cache_min_tokens: int = Field(2048, ge=0, le=10_000_000)
    max_message_chars: int = Field(2000, ge=200, le=10_000_000)
    max_content_chars: int = Field(1_000_000, ge=1000, le=100_000_000)
    topic_summary_tokens: int = Field(200, ge=20, le=100_000)
    bulk_summary_tokens: int = Field(300, ge=20, le=100_000)
    bulk_merge_size: int = Field(3, ge=2, le=100)
    silence_minutes: float = Field(30.0, gt=0, le=525_600)
    token_threshold: float = Field(0.60, gt=0.0, le=1.0)
    max_topic_tokens: int = Field(1200, ge=0, le=10_000_000)
    """The size rule seals a topic at ``token_threshold`` of the current topic's share and at most
    at this many tokens (0: no cap). Binds above budgets of 4,000 tokens."""
    boundaries: BoundarySettings = Field(default_factory=lambda: BoundarySettings())
    # Factories are lambdas, not dict/list: pydantic reads a factory's signature, and a builtin's
    # is parsed from text with the tokenize module (~3 ms of every start-up).
    platforms: dict[str, PlatformSettings] = Field(default_factory=lambda: {})
    summarizer: SummarizerSettings = Field(default_factory=lambda: SummarizerSettings())
    summarize_inline: bool = False
    maintenance_interval_seconds: float = Field(30.0, gt=0, le=86_400)
    lease_seconds: float = Field(300.0, ge=1, le=86_400)
    summary_max_attempts: int = Field(5, ge=1, le=100)
    retry_backoff_seconds: float = Field(60.0, ge=0, le=86_400)

    def __init__(self, **values: Any) -> None:
        # Keyword arguments win over the environment, section by section (what BaseSettings did).
        super().__init__(**_deep_merge(_env_values(), values))

    @classmethod
    def load(cls, config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
        """Build settings from a YAML file, the environment and keyword overrides.

        Raises :class:`ConfigurationError` naming the bad key and what is allowed.
        """
        path = config_file or os.environ.get("TIERED_HISTORY_CONFIG")
        file_values: dict[str, Any] = {}
        if path:
            file_values = read_yaml(Path(path))
        # The original design's layout (ADR-033) is read as well, in the file or the overrides.
        file_values, aliases = from_design_layout(file_values)
        overrides, more = from_design_layout(dict(overrides))
        env_values = _env_values()
        merged = _deep_merge(_deep_merge(file_values, env_values), overrides)
        try:
            # Environment values were merged above, key by key, so that a nested variable
            # combines with the file's section; __init__ (which model_validate calls) merges
            # them again, beneath the values passed in, which already hold them.
            return cls.model_validate(merged)
        except ValidationError as exc:
            raise ConfigurationError(describe_validation_error(exc, {**aliases, **more})) from None

    @property
    def topic_share_tokens(self) -> int:
        return int(self.context_budget * self.tiers.topic_summaries)


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # only when a file is read: PyYAML adds ~8 ms to every start-up

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(f"config file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigurationError(f"config file {str(path)!r} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"config file {str(path)!r} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigurationError(f"config file {str(path)!r} must hold a mapping of settings")
    return data


#: ``TIERED_HISTORY_*`` variables that are not settings: the config file's path, the inspector's
#: token, the migrations' partition count, and (by prefix) test and benchmark switches. Any
#: other unknown variable is an error, so a misspelt setting cannot be silently ignored.
NOT_SETTINGS: frozenset[str] = frozenset({"CONFIG", "WEB_TOKEN", "PG_PARTITIONS", "CHROMIUM", "SCREENSHOTS"})
NOT_SETTINGS_PREFIXES: tuple[str, ...] = ("TEST_", "BENCH_")


def _env_values() -> dict[str, Any]:
    """``TIERED_HISTORY_*`` variables as a nested dict (values parsed as YAML, so lists can be
    written ``[user, assistant]``); an unknown one is kept, for validation to reject by name."""
    out: dict[str, Any] = {}
    prefix = "TIERED_HISTORY_"
    for key, raw in os.environ.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if name in NOT_SETTINGS or name.startswith(NOT_SETTINGS_PREFIXES):
            continue
        parts = name.lower().split("__")
        import yaml  # only when such a variable is set (see read_yaml)

        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError:
            value = raw
        if parts[0] == "database_url" or parts[-1] in {"api_key", "model", "api_base"}:
            value = raw  # never reinterpret URLs, keys or model names
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def describe_validation_error(exc: ValidationError, aliases: dict[str, str] | None = None) -> str:
    """One line naming each bad key (``aliases``: our key -> the key the user wrote, when it differs)."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        if aliases and key in aliases:
            key = f"{aliases[key]} ({key})"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown setting"
        parts.append(f"{key}: {msg}")
    return "invalid configuration: " + "; ".join(parts)


# -- the original design's layout ------------------------------------------------------------------

#: Where ADR-033 puts the settings: ``conversation.history.compression`` (and ``...history.model``).
DESIGN_ROOT = "conversation.history.compression"
#: Each key of that section (camelCase, as the design writes it) and the setting it maps onto.
DESIGN_KEYS: dict[str, tuple[str, ...]] = {
    "tiers.currentTopic": ("tiers", "current_topic"),
    "tiers.historicalTopics": ("tiers", "topic_summaries"),
    "tiers.bulkArchives": ("tiers", "bulk_archives"),
    "maxMessageChars": ("max_message_chars",),
    "topicSummaryTokens": ("topic_summary_tokens",),
    "bulkSummaryTokens": ("bulk_summary_tokens",),
    "bulkMergeSize": ("bulk_merge_size",),
    "topicBoundary.silenceMinutes": ("silence_minutes",),
    "topicBoundary.tokenThreshold": ("token_threshold",),
}
#: ``enabled: false``: no topic boundary is ever drawn, so nothing is summarised and the context
#: is the newest messages verbatim (plus pinned ones and recall), cut to the budget.
_DISABLED = {"boundaries": {"explicit": False, "temporal": False, "size": False, "cohesion": False}}


def _section(value: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if value is None:  # a YAML key with nothing under it
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"invalid configuration: {where}: must be a mapping of settings")
    for key in value:
        if key not in known:
            raise ConfigurationError(
                f"invalid configuration: {where}.{key}: unknown setting (known here: {', '.join(known)})"
            )
    return value


def _leaves(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for key, value in values.items():
        path = (*prefix, str(key))
        out |= _leaves(value, path) if isinstance(value, dict) and value else {path}
    return out


def from_design_layout(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``values`` with a ``conversation:`` section in ADR-033's layout mapped onto our settings.

    Returns the settings and, for error messages, each mapped key's name in the design's layout.
    Raises :class:`ConfigurationError` for a key that layout does not have, and for a setting
    given in both layouts (which one wins would be a guess).
    """
    if "conversation" not in values:
        return values, {}
    rest = {k: v for k, v in values.items() if k != "conversation"}
    conversation = _section(values["conversation"], "conversation", ("history",))
    history = _section(conversation.get("history", {}), "conversation.history", ("compression", "model"))
    groups = ("tiers", "topicBoundary")
    top = ("enabled", *(k.split(".")[0] for k in DESIGN_KEYS))
    compression = _section(history.get("compression", {}), DESIGN_ROOT, tuple(dict.fromkeys(top)))
    mapped: dict[str, Any] = {}
    aliases: dict[str, str] = {}

    def put(path: tuple[str, ...], value: Any, written: str) -> None:
        node = mapped
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        aliases[".".join(path)] = written

    for key, value in compression.items():
        if key in groups:
            known = tuple(k.split(".")[1] for k in DESIGN_KEYS if k.startswith(key + "."))
            for sub, item in _section(value, f"{DESIGN_ROOT}.{key}", known).items():
                put(DESIGN_KEYS[f"{key}.{sub}"], item, f"{DESIGN_ROOT}.{key}.{sub}")
        elif key == "enabled":
            if not isinstance(value, bool):
                raise ConfigurationError(
                    f"invalid configuration: {DESIGN_ROOT}.enabled: must be true or false"
                )
            if not value:
                for name, on in _DISABLED["boundaries"].items():
                    put(("boundaries", name), on, f"{DESIGN_ROOT}.enabled")
        else:
            put(DESIGN_KEYS[key], value, f"{DESIGN_ROOT}.{key}")
    model = history.get("model")
    if model is not None:  # null: the default summariser (ours is the offline extractive one)
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(
                "invalid configuration: conversation.history.model: must be a model name or null"
            )
        put(("summarizer", "kind"), "litellm", "conversation.history.model")
        put(("summarizer", "model"), model, "conversation.history.model")
    twice = sorted(_leaves(mapped) & _leaves(rest))
    if twice:
        ours = ".".join(twice[0])
        raise ConfigurationError(
            f"invalid configuration: {ours} is set twice, as {aliases[ours]} and as {ours}; keep one"
        )
    return _deep_merge(rest, mapped), aliases
