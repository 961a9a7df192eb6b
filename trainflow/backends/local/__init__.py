"""Local backend: N nodes x M processes on this machine, one torchrun agent per node.

Each node's agent starts in its own session with c10d rendezvous (node 0 hosts the store). By
default every node shares loopback; with `resources.network: namespaces` each node is a "host" in
its own network namespace with its own address, so a node can drop off the network. gloo on CPU,
nccl when the spec asks for GPUs (each node gets its own devices).

`launcher` is the Launcher and its drill abilities, `agent_command` how each node's agent is
started, `observe` how a silent node and a hung rank look from outside.
"""
