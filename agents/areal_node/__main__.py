"""`python3 -m areal_node` (and `python3 payload.pyz`): the agent, on stdin and stdout."""

from areal_node.agent.serve import main

main()
