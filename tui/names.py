"""Short node names that stay distinct: drop the shared domain, then elide around the part that differs."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

ELLIPSIS = "…"
MIN_WIDTH = 2  # one character and the ellipsis


def common_domain(ids: Sequence[str]) -> str:
    """The dot-aligned suffix every id shares (`.example.internal`); one id's own domain when alone."""
    if not ids:
        return ""
    tail = ids[0]
    for node_id in ids[1:]:
        while not node_id.endswith(tail):
            tail = tail[1:]
    dot = tail.find(".")
    domain = tail[dot:] if dot >= 0 else ""
    return domain if all(len(node_id) > len(domain) for node_id in ids) else ""


def shared_lengths(names: Sequence[str]) -> list[int]:
    """For each name, the longest prefix it shares with any other: its neighbours in sorted order."""
    order = sorted(range(len(names)), key=names.__getitem__)
    shared = [0] * len(names)
    for left, right in itertools.pairwise(order):
        a, b = names[left], names[right]
        length = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        shared[left], shared[right] = max(shared[left], length), max(shared[right], length)
    return shared


def elide(name: str, width: int, first: int, last: int) -> str:
    """`name` in `width` cells with name[first:last] (what tells it apart) kept in view when it fits."""
    if len(name) <= width:
        return name
    room = width - 1
    if len(name) - first <= room:  # the differing part sits at the end: cut in front of it
        head = min(room - (len(name) - first), room // 3)
        return name[:head] + ELLIPSIS + name[len(name) - (room - head):]
    if last <= room:  # the differing part sits at the start: cut after it
        tail = min(room - last, room // 3)
        return name[:room - tail] + ELLIPSIS + (name[len(name) - tail:] if tail else "")
    start = min(first, len(name) - room)  # a window that starts where the name starts to differ
    if not start:
        return name[:room] + ELLIPSIS
    return ELLIPSIS + name[start:start + max(1, room - 1)] + ELLIPSIS  # one character at least, even if wider


def cut(ids: Sequence[str], width: int) -> list[str]:
    domain = common_domain(ids)
    stems = [node_id[:len(node_id) - len(domain)] for node_id in ids]
    room = width - 1  # beside the ellipsis that stands for the domain
    firsts = shared_lengths(stems)
    lasts = [len(s) - n for s, n in zip(stems, shared_lengths([s[::-1] for s in stems]), strict=True)]
    names = []
    for stem, first, last in zip(stems, firsts, lasts, strict=True):
        last = max(last, first + 1)
        whole = elide(stem, max(width, MIN_WIDTH), first, last)
        if domain and not whole.endswith(ELLIPSIS):  # an ellipsis at the end stands for the domain too
            whole = elide(stem, max(room, MIN_WIDTH), first, last)
            whole += "" if whole.endswith(ELLIPSIS) else ELLIPSIS
        names.append(whole)
    return names


def short_names(ids: Sequence[str], width: int) -> dict[str, str]:
    """node id -> a name of at most `width` cells; never two alike, wider than `width` only when it must be.

    Ids that fit stay whole. Otherwise the domain shared by all (`.example.internal`) becomes `…`, then each
    name is cut in the middle around the characters that tell it from its nearest neighbour, so
    `gpu-node-017…` and `gpu-node-018…` stay apart. If cut names would collide (a width too narrow for the
    number of nodes), the width grows until none do: a wider column beats an ambiguous one.
    """
    ids = list(dict.fromkeys(ids))
    longest = max(map(len, ids), default=0)
    if longest <= width:
        return {node_id: node_id for node_id in ids}
    for tried in range(max(width, MIN_WIDTH), longest):
        names = cut(ids, tried)
        if len(set(names)) == len(names):
            return dict(zip(ids, names, strict=True))
    return {node_id: node_id for node_id in ids}
