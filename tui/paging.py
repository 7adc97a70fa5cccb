"""Large jobs: which page of the node list to ask `status` for, and the keys of rows not fetched yet."""

from __future__ import annotations

from dataclasses import dataclass

PAGED_ABOVE = 64  # nodes: above this the console pages `status` and follows only the daemons on screen
FIRST_PAGE = 128  # nodes asked for before the job's size is known: a screenful, and all of a small job
PAGE_MARGIN = 32  # rows fetched above and below those shown: a short scroll finds its rows already there
PLACEHOLDER = "\0"  # starts the key of a row whose node is not fetched yet (no node id starts so)


def placeholder(index: int) -> str:
    return f"{PLACEHOLDER}{index}"


def is_placeholder(key: str) -> bool:
    return key.startswith(PLACEHOLDER)


@dataclass
class RowsShown:
    """The rows of the nodes table on screen (join order); set by the view, read by the poller."""

    first: int = 0
    count: int = 40

    def page(self) -> tuple[int, int]:
        """(nodes_offset, nodes_limit) of the page to fetch: the rows shown and a margin each side."""
        offset = max(0, self.first - PAGE_MARGIN)
        return offset, self.first + self.count + PAGE_MARGIN - offset

    def covered_by(self, offset: int, limit: int) -> bool:
        return offset <= self.first and self.first + self.count <= offset + limit
