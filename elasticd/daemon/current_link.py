"""The member's link as its daemon holds it now: the link failover re-points, or none while we coordinate."""

from __future__ import annotations

from typing import Protocol

from elasticd.mesh.member_mesh import MemberMesh


class LinkHolder(Protocol):
    """The daemon's slot for the member's link (daemon.py; failover re-points it, a takeover empties it)."""

    @property
    def member_mesh(self) -> MemberMesh | None: ...


class CurrentLink:
    """The member mesh the daemon holds now, as its Member sees it (failover replaces the mesh; none: we coordinate)."""

    def __init__(self, daemon: LinkHolder) -> None:
        self.d = daemon

    def backlog(self) -> bool:
        return self.d.member_mesh is not None and self.d.member_mesh.backlog()

    def link_up(self) -> bool:
        return self.d.member_mesh is not None and self.d.member_mesh.link_up

    def foreign(self) -> bool:
        return self.d.member_mesh is not None and self.d.member_mesh.foreign()

    def route(self, via: str) -> None:
        if self.d.member_mesh is not None:
            self.d.member_mesh.route(via)

    def state(self) -> dict[str, str]:
        return self.d.member_mesh.state() if self.d.member_mesh is not None else {}
