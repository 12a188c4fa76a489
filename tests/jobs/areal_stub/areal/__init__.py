"""A stand-in for the parts of AReaL (areal-project/AReaL at cbff54d6) whose processes and
stacks the console recognises, for tests only: module paths, command lines, thread names
and function names match AReaL's; the work done is a small gloo job that hangs."""
