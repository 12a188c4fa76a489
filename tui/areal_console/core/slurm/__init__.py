"""Slurm."""
