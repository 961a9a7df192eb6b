"""One pod's container, run on this machine the way a kubelet and its container runtime run it.

The image is this machine's root filesystem under an overlay (what the container writes stays in
the pod), with the project at the image's working directory (/app, read-only, as the image's user
cannot write it) and a fresh /tmp. The pod gets namespaces of its own: network (one node of a
`NodeNetwork`, its address on a bridge the orchestrator listens on), mounts, hostname (the pod's,
with the /etc/hosts a headless Service's DNS would answer), and processes (the container's command
is PID 1, and every process of the pod ends with it). Its volumes are what the pod spec asks for:
a Secret's items as files, an emptyDir as a new folder made 0777 (as the kubelet makes it), a
memory emptyDir as a tmpfs. The command runs as the image's user (uid 1000, infra/Dockerfile)
without privilege escalation, with the container's environment as the pod spec resolves it.

Needs root, iproute2 and util-linux (unshare, setpriv), as the node-loss tests do.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.backends.netns import NodeNetwork
from trainflow.repro.environment import PROJECT_ROOT

IMAGE_USER = 1000  # infra/Dockerfile: `USER 1000`
IMAGE_HOME = "/home/trainflow"
IMAGE_WORKDIR = "/app"
MESSAGE_BYTES, MESSAGE_LINES = 2048, 80  # FallbackToLogsOnError: the log's tail, at most this much
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

SecretLookup = Callable[[str], dict[str, str]]  # a Secret's name -> its decoded data


def secret_data(doc: dict) -> dict[str, str]:
    data = {key: base64.b64decode(value).decode() for key, value in (doc.get("data") or {}).items()}
    data.update(doc.get("stringData") or {})
    return data


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class PodSandbox:
    pod: dict  # the Pod object as the cluster stores it (metadata, spec)
    folder: Path  # everything of this pod on this machine: its root's layers, volumes and log
    network: NodeNetwork
    slot: int  # which namespace of `network` is this pod's machine
    hosts: dict[str, str]  # name -> address, as the cluster's DNS answers the pod
    secrets: SecretLookup
    process: subprocess.Popen | None = None
    started_at: str = ""
    finished_at: str = ""
    _stopping: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def container(self) -> dict:
        return self.pod["spec"]["containers"][0]

    @property
    def log(self) -> Path:
        return self.folder / "container.log"

    # start ------------------------------------------------------------------------------------

    def start(self) -> None:
        for part in ("image-files", "layers", "root", "volumes"):
            (self.folder / part).mkdir(parents=True)
        mounts = self._volumes()
        self._image_files()
        env = self._environment()
        script = self._setup_script(mounts)
        command = [*self.container.get("command", []), *self.container.get("args", [])]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    *self.network.wrap([], self.slot),
                    "unshare",
                    "--mount",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--propagation",
                    "private",
                    "--",
                    "/bin/sh",
                    "-c",
                    script,
                    "pod",
                    *command,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = _now()

    def _volumes(self) -> list[tuple[Path, str, str]]:
        """Each volume made on this machine; returns (source, mount path, kind) per volume mount."""
        made: dict[str, tuple[Path, str]] = {}
        for volume in self.pod["spec"].get("volumes", []):
            path = self.folder / "volumes" / volume["name"]
            if "secret" in volume:
                data = self.secrets(volume["secret"]["secretName"])
                path.mkdir(mode=0o755)
                for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in data]:
                    target = path / item["path"]
                    target.write_text(data[item["key"]])
                    os.chmod(target, 0o644)  # the Secret volume's default mode
                made[volume["name"]] = (path, "secret")
            elif "emptyDir" in volume:
                path.mkdir()
                os.chmod(path, 0o777)  # as the kubelet makes an emptyDir: anyone may write, no sticky bit
                kind = "tmpfs" if volume["emptyDir"].get("medium") == "Memory" else "dir"
                made[volume["name"]] = (path, kind)
            else:
                raise NotImplementedError(f"volume {volume['name']}: only secret and emptyDir volumes run here")
        return [
            (made[m["name"]][0], m["mountPath"], "ro" if m.get("readOnly") else made[m["name"]][1])
            for m in self.container.get("volumeMounts", [])
        ]

    def _image_files(self) -> None:
        """What the image has that this machine's root lacks: the image's user and home, the pod's
        name service, and a way for that user to the interpreter."""
        upper = self.folder / "image-files"
        etc = upper / "etc"
        etc.mkdir()
        hostname = self.pod["spec"].get("hostname") or self.name
        own = self.network.node_address(self.slot)
        lines = ["127.0.0.1 localhost", f"{own} {self._fqdn(hostname)} {hostname}".strip()]
        lines += [f"{address} {name}" for name, address in self.hosts.items() if address != own]
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")
        for name, entry in (
            ("passwd", f"trainflow:x:{IMAGE_USER}:{IMAGE_USER}::{IMAGE_HOME}:/bin/sh"),
            ("group", f"trainflow:x:{IMAGE_USER}:"),
        ):
            lines = Path("/etc", name).read_text().splitlines()
            kept = [line for line in lines if line.split(":")[2:3] != [str(IMAGE_USER)]]
            (etc / name).write_text("\n".join([*kept, entry]) + "\n")
        home = upper / IMAGE_HOME.lstrip("/")
        home.mkdir(parents=True)
        os.chown(home, IMAGE_USER, IMAGE_USER)
        # the interpreter is the image's: each folder on the way to it must let the image's user through
        for folder in reversed(Path(os.path.realpath(sys.executable)).parents):
            info = os.stat(folder)
            if folder != Path("/") and not info.st_mode & stat.S_IXOTH:
                mirror = upper / folder.relative_to("/")
                mirror.mkdir(parents=True, exist_ok=True)
                os.chmod(mirror, stat.S_IMODE(info.st_mode) | 0o005)

    def _fqdn(self, hostname: str) -> str:
        subdomain = self.pod["spec"].get("subdomain")
        return f"{hostname}.{subdomain}" if subdomain else ""

    def _environment(self) -> dict[str, str]:
        venv = Path(sys.prefix)
        try:
            venv = Path(IMAGE_WORKDIR) / venv.relative_to(PROJECT_ROOT)  # the project is the image's /app
        except ValueError:
            pass
        env = {
            "PATH": f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": IMAGE_HOME,
            "HOSTNAME": self.pod["spec"].get("hostname") or self.name,
            # infra/Dockerfile's ENV
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": IMAGE_WORKDIR,
            "TRAINFLOW_HOME": "/tmp/trainflow",
        }
        for source in self.container.get("envFrom", []):
            env.update(self.secrets(source["secretRef"]["name"]))
        for variable in self.container.get("env", []):
            env[variable["name"]] = self._value(variable, env)
        return env

    def _value(self, variable: dict, env: dict[str, str]) -> str:
        if "value" in variable:  # $(VAR) expands the variables defined before it
            return _VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), variable["value"])
        source = variable["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            found = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
            if found:
                return self.pod["metadata"].get(found.group(1), {}).get(found.group(2), "")
            return {"metadata.name": self.name, "metadata.namespace": self.pod["metadata"]["namespace"]}[path]
        reference = source["secretKeyRef"]
        return self.secrets(reference["name"])[reference["key"]]

    def _setup_script(self, mounts: list[tuple[Path, str, str]]) -> str:
        """Run as root in the pod's new namespaces: its root, then the command as the image's user."""
        q = shlex.quote
        root, files, layers = (q(str(self.folder / part)) for part in ("root", "image-files", "layers"))
        lines = [
            "set -e",
            # the container's writable layer in memory: an overlay's upper layer cannot be on every
            # filesystem this machine's root may be (another overlay), and it goes with the pod
            f"mount -t tmpfs -o mode=0755 tmpfs {layers}",
            f"mkdir {layers}/upper {layers}/work",
            f"cp -a {files}/. {layers}/upper/",
            f"mount -t overlay overlay -o lowerdir=/,upperdir={layers}/upper,workdir={layers}/work {root}",
            f"mount -t proc proc {root}/proc",
            f"mount --rbind /dev {root}/dev",
            f"mount --rbind /sys {root}/sys",
            f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp",
            f"mkdir -p {root}{IMAGE_WORKDIR}",
            f"mount --bind {q(str(PROJECT_ROOT))} {root}{IMAGE_WORKDIR}",
            f"mount -o remount,bind,ro {root}{IMAGE_WORKDIR}",
        ]
        for source, target, kind in mounts:
            lines.append(f"mkdir -p {root}{q(target)}")
            if kind == "tmpfs":
                lines.append(f"mount -t tmpfs -o mode=0777 tmpfs {root}{q(target)}")
                continue
            lines.append(f"mount --bind {q(str(source))} {root}{q(target)}")
            if kind == "ro":
                lines.append(f"mount -o remount,bind,ro {root}{q(target)}")
        hostname = self.pod["spec"].get("hostname") or self.name
        workdir = self.container.get("workingDir") or "/"
        lines += [
            f"hostname {q(hostname)}",
            f"exec chroot {root} setpriv --reuid={IMAGE_USER} --regid={IMAGE_USER} --clear-groups "
            f'--no-new-privs -- env -C {q(workdir)} -- "$@"',
        ]
        return "\n".join(lines)

    # follow and stop --------------------------------------------------------------------------

    @property
    def exit_code(self) -> int | None:
        """The container's exit code once it ended (a signal's as the runtime reports it: 128 + n)."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            return None
        if not self.finished_at:
            self.finished_at = _now()
        return 128 - code if code < 0 else code

    def status(self) -> dict:
        """The pod's status as the kubelet reports it."""
        code = self.exit_code
        address = self.network.node_address(self.slot)
        conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": self.started_at}]
        if code is None:
            state = {"running": {"startedAt": self.started_at}}
            return {
                "phase": "Running",
                "podIP": address,
                "conditions": conditions,
                "containerStatuses": [self._container_status(state, True)],
            }
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
        if code != 0 and self.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            terminated["message"] = self.log_tail(MESSAGE_LINES)[-MESSAGE_BYTES:]
        return {
            "phase": "Succeeded" if code == 0 else "Failed",
            "podIP": address,
            "conditions": conditions,
            "containerStatuses": [self._container_status({"terminated": terminated}, False)],
        }

    def _container_status(self, state: dict, running: bool) -> dict:
        return {
            "name": self.container["name"],
            "state": state,
            "lastState": {},
            "ready": running,
            "started": running,
            "restartCount": 0,
            "image": self.container["image"],
            "imageID": "",
        }

    def log_tail(self, lines: int) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "".join(text.splitlines(keepends=True)[-lines:])

    def _init_pid(self) -> int | None:
        """The container's PID 1, as this machine numbers it: the one child of `unshare`."""
        if self.process is None:
            return None
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def stop(self, grace_s: float) -> None:
        """As the kubelet deletes a pod: SIGTERM to PID 1, SIGKILL after the grace period; then the
        pod's folder goes (its mounts went with its namespace)."""
        if self.process is not None and self.process.poll() is None:
            init = self._init_pid()
            if init is not None:
                try:
                    os.kill(init, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # unshare: PID 1, and with it the whole pod
                self.process.wait(timeout=30)
        self.exit_code  # noqa: B018  (notes when it ended)
        shutil.rmtree(self.folder, ignore_errors=True)
