"""Connection."""
