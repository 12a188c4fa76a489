from areal_agent.agent import main

main()
