"""A bug report in AReaL's issue template: collected from a job's nodes (or a saved
capture and the log directory), secrets masked, with a bounded bundle beside it."""
