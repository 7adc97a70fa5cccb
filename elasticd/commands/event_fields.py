"""An event's fields read as a few words each, whatever the record holds: counts, seconds, node names, rank spans."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import TypeGuard

from elasticd.commands.render import ELLIPSIS, significant, span

Name = Callable[[str], str]  # a node id -> the name shown (the console shortens ids)
REASON_CHARS = 200  # a reason, a detail, an error message
WORD_CHARS = 60  # a host, an op, a key, a rank span: one token of the sentence
LISTED = 6  # nodes, buckets or fields named before "and N more"
PHASES_SHOWN = 8


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + ELLIPSIS


def telling_line(text: str) -> str:
    """A multi-line text's line worth reading: a traceback's last (the exception), else its first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def is_int(value: object) -> TypeGuard[int]:
    """A plain int of a sane size (a bool is no count; a huge int has no short text)."""
    return isinstance(value, int) and not isinstance(value, bool) and value.bit_length() < 64


def number(value: object) -> float | None:
    return float(value) if is_int(value) or isinstance(value, float) else None


def seconds(value: float | None) -> str:
    """3 significant digits, without trailing zeros: 6.2 s, 0.0493 s, 1234 s."""
    if value is None:
        return "?"
    text = significant(value)
    return f"{text.rstrip('0').rstrip('.') if '.' in text and 'e' not in text else text} s"


def percent(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def listed(items: list[str]) -> str:
    if not items:
        return "none"
    more = f" and {len(items) - LISTED} more" if len(items) > LISTED else ""
    return ", ".join(items[:LISTED]) + more


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def ranks_text(ranks: list[int]) -> str:
    """rank 3, ranks 0-3, ranks 0,2,5; no ranks."""
    if not ranks:
        return "no ranks"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {clip(span(sorted(ranks)), WORD_CHARS)}"


def exit_text(code: object) -> str:
    if not is_int(code):
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def value_text(value: object, limit: int = REASON_CHARS) -> str:
    """A field's value, whatever it holds, in a few words: never a dict's or a list's repr."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if is_int(value):
        return str(value)
    if isinstance(value, float):
        return clip(significant(value), limit)
    if isinstance(value, str) and value.strip():
        return clip(telling_line(value), limit)
    if isinstance(value, list) and value and len(value) <= LISTED \
            and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        return clip(",".join(value_text(v, WORD_CHARS) for v in value), limit)
    if isinstance(value, list | dict):
        return plural(len(value), "item")
    return "?"


def fields_text(fields: Mapping[object, object], skip: tuple[str, ...] = ()) -> str:
    """`key: value, …` of the first few fields: what an event without its own sentence says."""
    shown = [f"{value_text(k, WORD_CHARS)}: {value_text(v, WORD_CHARS)}" for k, v in fields.items() if k not in skip]
    more = f" and {len(shown) - 2 * LISTED} more" if len(shown) > 2 * LISTED else ""
    return ", ".join(shown[:2 * LISTED]) + more


def timeline_text(timeline: object) -> str:
    """detect 0.00 → rendezvous 0.10 → … → first_step 2.31 (seconds from detection)."""
    phases = [(value_text(p, WORD_CHARS), number(t)) for p, t in timeline.items()] if isinstance(timeline, dict) else []
    return " → ".join(f"{p} {t:.2f}" for p, t in phases[:PHASES_SHOWN] if t is not None)


def parts_text(parts: object) -> str:
    """leave 0.30 + group 0.80 + … = 2.20 (a duration's parts, in seconds, and their sum)."""
    named = [(value_text(p, WORD_CHARS), number(t)) for p, t in parts.items()] if isinstance(parts, dict) else []
    shown = [(p, t) for p, t in named[:PHASES_SHOWN] if t is not None]
    return f"{' + '.join(f'{p} {t:.2f}' for p, t in shown)} = {sum(t for _, t in shown):.2f}" if shown else ""


class Body:
    """An event's fields, read so that a record from another version, or a broken one, still reads."""

    def __init__(self, fields: object, name: Name) -> None:
        # Keys too are whatever they are: an event not yet through JSON may have int keys (`exit_codes`).
        self.fields: Mapping[object, object] = fields if isinstance(fields, Mapping) else {}
        self.name = name

    def has(self, key: str) -> bool:
        return self.fields.get(key) not in (None, "", [], {})

    def sub(self, key: str) -> Body:
        return Body(self.fields.get(key), self.name)

    def text(self, key: str, limit: int = REASON_CHARS) -> str:
        return value_text(self.fields.get(key), limit)

    def texts(self, key: str) -> str:
        """A list of reasons, each a line: `a; b`, bounded as one reason."""
        value = self.fields.get(key)
        items = [value_text(v) for v in value[:LISTED]] if isinstance(value, list) else []
        return clip("; ".join(items), REASON_CHARS) if items else "?"

    def word(self, key: str) -> str:
        return self.text(key, WORD_CHARS)

    def count(self, key: str) -> str:
        value = self.fields.get(key)
        return str(value) if is_int(value) else "?"

    def number(self, key: str) -> float | None:
        return number(self.fields.get(key))

    def seconds(self, key: str) -> str:
        return seconds(self.number(key))

    def name_of(self, node_id: object) -> str:
        return clip(self.name(node_id), WORD_CHARS) if isinstance(node_id, str) and node_id else "?"

    def node(self, key: str) -> str:
        return self.name_of(self.fields.get(key))

    def nodes(self, key: str) -> str:
        value = self.fields.get(key)
        return listed([self.name_of(v) for v in value] if isinstance(value, list) else [])

    def ranks(self, key: str) -> str:
        value = self.fields.get(key)
        return ranks_text([r for r in value if is_int(r)] if isinstance(value, list) else [])

    def numbers(self, key: str) -> dict[str, float]:
        """The field's numeric entries, by key: a `goodput` event's seconds by bucket."""
        found = ((value_text(k, WORD_CHARS), number(raw)) for k, raw in self.sub(key).fields.items())
        return {k: v for k, v in found if v is not None}

    def timeline(self) -> str:
        return timeline_text(self.fields.get("timeline"))

    def parts(self, key: str) -> str:
        return parts_text(self.fields.get(key))

    def op(self) -> str:
        return f" (op {self.word('op_id')})" if self.has("op_id") else ""
