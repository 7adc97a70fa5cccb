"""What every side of a daemon shares: the job's settings, its event log and logs, this host's paths and ports."""
