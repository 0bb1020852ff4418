"""``python3 -I rigd_agent.pyz ...``: the agent's command line (:func:`rigd_agent.main.main`)."""

from rigd_agent.main import main

main()
