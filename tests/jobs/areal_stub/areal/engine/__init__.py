"""Stand-in engines (tests only)."""
