"""The hardware a run used, as a platform team reviews it: CPU model and counts, memory, GPUs and,
where NVIDIA GPUs exist, the interconnect matrix from `nvidia-smi topo -m`."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import psutil


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_topology() -> str:
    lines = [
        f"host: {platform.node()} ({platform.system()} {platform.release()}, {platform.machine()})",
        f"cpu: {cpu_model()}; {psutil.cpu_count(logical=False)} cores, {os.cpu_count()} threads",
        f"memory: {psutil.virtual_memory().total / 2**30:.1f} GiB",
    ]
    if not _gpu_devices_present():
        lines.append("gpu: none")  # without importing torch, seconds on the path to the first step
        return _with_interconnect(lines)
    try:
        import torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                lines.append(f"gpu {index}: {props.name}, {props.total_memory / 2**30:.1f} GiB")
        else:
            lines.append("gpu: none")
    except ImportError:
        pass
    return _with_interconnect(lines)


def _gpu_devices_present() -> bool:
    """Whether this host has the device nodes a CUDA or ROCm GPU needs; torch can see none without them."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


def _with_interconnect(lines: list[str]) -> str:
    if shutil.which("nvidia-smi"):
        try:
            matrix = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
            lines += ["", "nvidia-smi topo -m:", matrix.stdout.strip() or matrix.stderr.strip()]
        except subprocess.SubprocessError:
            lines.append("nvidia-smi topo -m: timed out")
    return "\n".join(lines) + "\n"
