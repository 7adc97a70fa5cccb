"""elastic-tui: the Textual console that watches and steers elasticd jobs."""
