"""What crosses a process boundary: the envelope and codec, the names of ops and events, typed results, handshakes."""
