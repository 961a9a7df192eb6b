"""Warm workers: per node, one standby interpreter (a "zygote") that has already imported torch,
torchrun's agent, trainflow's runtime and the script's own installed modules, and forks each
attempt's agent and ranks instead of letting them start new interpreters.

A recovery then costs a fork, a rendezvous and a restore, not two interpreter starts with their
imports. The zygote stays single-threaded and idle (no CPU while training runs); every process it
forks starts a session of its own, as torchrun's workers do, and runs its command as a new
interpreter would (`python -u script.py ARGS`: its own argv, environment, working directory,
stdio, `__main__`, and fresh random seeds).

`protocol` frames messages (with file descriptors) on a Unix socket, `zygote` is the standby
process, `child` what a forked process does to become its command, `client` the Popen-like side
the launcher and the agent use, `torchrun_hook` the agent's worker starts, `preload` what is
imported ahead.
"""
