"""`agent-watchdog demo`: the watchdog against six real agent processes, in about ten seconds.

model.py   the scripted chat model (stateless: turn index + tool results -> answer)
tools.py   the tool catalogue over a few files (two tools broken on purpose)
agents.py  the agent loop and its six behaviours; `python -m watchdog.demo.agents`
runner.py  the orchestration: store, config, daemon and agent processes, cleanup
report.py  the live feed and the final table, read from the store
"""
