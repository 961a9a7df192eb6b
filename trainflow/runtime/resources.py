"""What a node uses, sampled inside the job and reported like everything else (workers never
write to MLflow): CPU and memory of the node's processes and of the host, network and storage
throughput, and GPU memory and utilisation where there are GPUs."""

from __future__ import annotations

import os
import threading
import time

import psutil
import torch

SAMPLE_EVERY_S = 5.0


class ResourceSampler:
    def __init__(self, send, interval_s: float = SAMPLE_EVERY_S):
        self._send = send
        self._interval = interval_s
        self._stop = threading.Event()
        try:
            self._node = psutil.Process(os.getppid())  # the node's torchrun agent and its workers
        except psutil.Error:
            self._node = psutil.Process()
        self._last_net = psutil.net_io_counters()
        self._last_disk = psutil.disk_io_counters()
        self._last_t = time.monotonic()
        psutil.cpu_percent()
        threading.Thread(target=self._run, name="trainflow-resources", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._send(self.sample())
            except psutil.Error:
                continue

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        elapsed = max(now - self._last_t, 1e-6)
        tree = [self._node, *self._node.children(recursive=True)]
        cpu, rss = 0.0, 0
        for proc in tree:
            try:
                cpu += proc.cpu_percent()
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        memory = psutil.virtual_memory()
        net, disk = psutil.net_io_counters(), psutil.disk_io_counters()
        figures = {
            "cpu_utilization_percentage": psutil.cpu_percent(),
            "node_processes_cpu_percentage": cpu,
            "node_processes_memory_megabytes": rss / 1e6,
            "system_memory_usage_percentage": memory.percent,
            "network_receive_megabytes_per_s": (net.bytes_recv - self._last_net.bytes_recv) / 1e6 / elapsed,
            "network_transmit_megabytes_per_s": (net.bytes_sent - self._last_net.bytes_sent) / 1e6 / elapsed,
        }
        if disk is not None and self._last_disk is not None:
            figures["disk_read_megabytes_per_s"] = (disk.read_bytes - self._last_disk.read_bytes) / 1e6 / elapsed
            figures["disk_write_megabytes_per_s"] = (disk.write_bytes - self._last_disk.write_bytes) / 1e6 / elapsed
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                figures[f"gpu_{index}_memory_usage_megabytes"] = torch.cuda.memory_allocated(index) / 1e6
                try:
                    figures[f"gpu_{index}_utilization_percentage"] = float(torch.cuda.utilization(index))
                except Exception:  # needs NVML (pynvml); memory alone is still worth reporting
                    pass
        self._last_net, self._last_disk, self._last_t = net, disk, now
        return figures
