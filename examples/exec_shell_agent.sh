#!/bin/sh
# A shell-script "agent" with no watchdog code at all: it loops on a fake tool forever, and starts
# a helper that leaves its session (setsid) and ignores SIGTERM, as browsers and MCP servers do.
# Run it as one watched run:
#
#   agent-watchdog exec --agent shell-bot --max-wall-s 20 -v -- sh examples/exec_shell_agent.sh
#
# The daemon stops the run at 20 s (wall_clock); exec takes the whole tree down, the stubborn
# helper included, and exits 124 with the reason on stderr. $AGENT_WATCHDOG_RUN names the run.

fake_tool() {  # "search the web": a tool that answers slowly and never helps
    sleep 0.2
    echo "result for $1"
}

# The stubborn helper: its own session, SIGTERM ignored. Its pid goes to $HELPER_PID_FILE if set.
setsid sh -c 'trap "" TERM; echo $$ > "${HELPER_PID_FILE:-/dev/null}"; while :; do sleep 1; done' &

i=0
while :; do
    i=$((i + 1))
    fake_tool "refund policy (attempt $i)" > /dev/null
    echo "run ${AGENT_WATCHDOG_RUN:-?}: tool call $i" >&2
done
