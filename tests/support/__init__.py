"""Test support, not tests: real daemons, network-namespace hosts, the fake clock and fake jobs, test workers."""
