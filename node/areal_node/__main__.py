from areal_node.agent import main

main()
