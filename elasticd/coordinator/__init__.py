"""The decisions: membership, rounds, transitions, step agreement, relays, resizes, restart accounting."""
