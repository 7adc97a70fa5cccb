"""REGISTRY: every verb of elasticd/commands/verbs/, by op, in `elasticd --help` order."""

from __future__ import annotations

import importlib
import pkgutil

from elasticd.commands import verbs
from elasticd.commands.verb import Command
from elasticd.wire.verb_requests import VerbRequest


def discover() -> dict[str, Command[VerbRequest]]:
    """Every module of the verbs package declares COMMANDS: a new verb is one new file there.

    Each verb takes its own request record; a caller gets it from that verb's `decode`, and hands it to that verb.
    """
    found = pkgutil.iter_modules(verbs.__path__)
    modules = [importlib.import_module(f"{verbs.__name__}.{info.name}") for info in found]
    commands = sorted((cmd for module in modules for cmd in module.COMMANDS), key=lambda cmd: cmd.order)
    return {cmd.name: cmd for cmd in commands}


REGISTRY: dict[str, Command[VerbRequest]] = discover()
