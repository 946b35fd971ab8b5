#!/usr/bin/env bash
# Run one step of a device check within a hard time limit, and leave nothing behind.
# Usage: bash benchmarks/bounded_step.sh SECONDS LOG COMMAND [ARG ...]
#
# Why: on a leased GPU machine a step that overruns must end, and so must everything it
# started. A plain `timeout N cmd | tee log` can hang past its limit: a process that ignores
# SIGTERM outlives the signal, and a child the step started (torch.compile's worker pool, a
# pytest-xdist worker) keeps the pipe open after its parent died, so `tee` never sees the end
# of its input. Here the step runs in a session of its own, writes to a file (no pipe), gets
# SIGTERM at the limit and SIGKILL 10 s later, and then every process still in its session is
# killed. The log is printed afterwards. Exit status: the step's, 124 if it timed out, 137 if
# it had to be killed.
set -uo pipefail
if [ "$#" -lt 3 ]; then
    echo "usage: bash benchmarks/bounded_step.sh SECONDS LOG COMMAND [ARG ...]" >&2
    exit 2
fi
limit=$1
log=$2
shift 2
mkdir -p "$(dirname "$log")"
# a background job of a non-interactive shell is no group leader, so setsid runs the command
# itself (no fork): its pid is the new session's id
setsid timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null &
session=$!
wait "$session"
status=$?
pkill -KILL -s "$session" 2>/dev/null || true
cat "$log"
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "bounded_step: '$*' stopped at its limit of $limit s (exit $status)" >&2
fi
exit "$status"
