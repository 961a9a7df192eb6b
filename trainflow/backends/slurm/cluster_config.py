"""The configuration of a local cluster: slurm.conf, and the hosts and resolver files its nodes' namespaces see."""

from __future__ import annotations

import socket
from pathlib import Path

from trainflow.backends.netns import NodeNetwork

NODE_CPUS = 2
NODE_MEMORY_MB = 4096
PARTITION = "debug"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(folder: Path, conf: Path, node_names: list[str], network: NodeNetwork) -> None:
    controller = network.host_address
    lines = [
        "# written by trainflow.backends.slurm.local_cluster",
        "ClusterName=trainflow",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({controller})",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # a short credential lifetime shortens the delay before a job may be requeued
        f"AuthInfo=socket={folder / 'munge' / 'munge.socket'},cred_expire=10",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool' / '%n'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=2",
        "SlurmdParameters=config_overrides",
        # drills want lost nodes noticed, killed jobs gone and cut nodes back quickly
        "SlurmdTimeout=10",
        "KillWait=5",
        "ReturnToService=1",
        "MinJobAge=300",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder / 'log' / 'jobcomp.txt'}",
    ]
    for index, name in enumerate(node_names):
        lines.append(
            f"NodeName={name} NodeAddr={network.node_address(index)} NodeHostname={name} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    conf.write_text("\n".join(lines) + "\n")
    hosts = ["127.0.0.1 localhost", f"{controller} {socket.gethostname()}"]
    hosts += [f"{network.node_address(i)} {name}" for i, name in enumerate(node_names)]
    (folder / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
    # no name server the namespaces could reach: lookups of unknown names fail at once instead
    # of timing out (gloo and c10d look up peers' names)
    (folder / "etc" / "resolv.conf").write_text("options timeout:1 attempts:1\n")
