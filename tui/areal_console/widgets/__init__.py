"""Reusable widgets, one per module."""
