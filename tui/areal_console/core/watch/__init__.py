"""Unattended watch of one training job: the decisions (`state`), the look at the job and
the evidence a stall leaves (`loop`, `evidence`), and where the watch writes (`files`)."""
