"""The front doors: `elasticd` and its verbs, `elasticd start` with torchrun's flags, `elasticd keys`."""
