"""Slurm backend: the same lifecycle on a Slurm cluster (`resources.backend: slurm`).

Each attempt is one batch job: `srun` starts one node agent (torchrun) per node, with c10d
rendezvous on the job's first node at a port picked there for that job. Workers report to the
orchestrator's status channel like local workers; Slurm's job and node states are the evidence for
what the workers could not report (a node failure, a preemption, a time limit). Slurm is driven
through its commands only (sbatch, squeue, scontrol, scancel, srun, sinfo).
"""
