"""Stand-in for AReaL v2's inference data proxy (tests only)."""
