"""Training metrics from AReaL's own logs and tensorboard files, and the guide's health checks."""
