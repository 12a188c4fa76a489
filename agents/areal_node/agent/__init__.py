"""The node agent, by subject. `serve` is the program (`python3 -m areal_node` runs its
`main`); every other module is one subject whose ops `serve` registers:

    protocol         protocol version, the op registry, argument checks
    serve            the Agent: requests, dispatch, replies; hello, ping, sample, stream, load
    threads          the request workers and parallel_map
    procfs           /proc reads and the process table sampler
    cmdline          what a command line says (Python, -m module, flags, wrappers)
    processes        roles, ranks and jobs of processes; the records a sample sends
    servers          inference servers and their health polls
    gpus             NVML
    pyspy            py-spy dumps
    flight_recorder  Flight Recorder traces (live and dumped)
    rank_socket      asking a rank's server: who answers (SO_PEERCRED), a deadline, a bound
    logs             following logs, finding a run's logs, reading files
    jobs             detached launches, staged files, dump indexes

Importing this package imports nothing else: the console takes the helpers it needs from
their modules without loading the whole agent.
"""
