"""Modal and pushed screens: confirmation, help, node detail."""
