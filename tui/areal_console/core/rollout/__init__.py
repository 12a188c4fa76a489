"""The rollout side of a job: inference servers' state, AReaL's staleness capacity, and
where each rank is in its step (the perf tracer's files)."""
