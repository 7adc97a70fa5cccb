"""The verbs, one module each: a new verb is one new file here, found by elasticd/commands/registry.py."""
