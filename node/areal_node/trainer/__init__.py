"""The reference trainer, shipped to nodes as a single torch-only script."""
