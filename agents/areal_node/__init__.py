"""The code areal-console runs on nodes: the agent, the batch reader, the reference trainer
and its launch hook, with the constants both sides share.

Standard library only and Python 3.9+ (the modules that use torch import it where they
need it). The console ships this package to a node as one zip (`core/connection/payload.py` builds
it) and imports nothing from it but these modules; nothing here imports the console.
"""
