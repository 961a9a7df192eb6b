"""A small W3C WebDriver client for headless Chromium through Debian's chromedriver.

Enough to drive the Prefect UI like a person: open a page, find elements, click, type, read text,
take a screenshot. Chromium and chromedriver come from apt (`chromium`, `chromium-driver`); the
browser test installs them when they are missing and it runs as root.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from trainflow.backends.ports import free_port

CHROMIUM_PACKAGES = ["chromium", "chromium-driver"]
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1400,1800",
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


class WebDriverError(RuntimeError):
    pass


def ensure_chromium(log: Path) -> str | None:
    """Install Debian's chromium and chromedriver if missing (as root); None when ready, else why not."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver, as root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(log, "ab") as out:
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", *CHROMIUM_PACKAGES],
        ):
            subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=600)
    return None


class Browser:
    """One headless Chromium session behind its own chromedriver process and profile."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="trainflow-chromium-")
        self._log = open(log, "ab")
        self.driver = subprocess.Popen(
            ["chromedriver", f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_for_driver()
        options = {"binary": shutil.which("chromium"), "args": [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}"]}
        session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}})
        self.session = f"/session/{session['sessionId']}"

    def _wait_for_driver(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except (OSError, WebDriverError):
                time.sleep(0.2)
        raise WebDriverError("chromedriver did not start")

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("value", {})
            raise WebDriverError(f"{method} {path}: {detail.get('error')}: {detail.get('message', '')[:500]}") from None

    def command(self, method: str, path: str, body: dict | None = None):
        return self._call(method, self.session + path, body)

    def open(self, url: str) -> None:
        self.command("POST", "/url", {"url": url})

    def script(self, source: str, *args):
        return self.command("POST", "/execute/sync", {"script": source, "args": list(args)})

    def find_all(self, css: str) -> list[dict]:
        return self.command("POST", "/elements", {"using": "css selector", "value": css})

    def wait_for(self, css: str, text: str | None = None, timeout_s: float = 60) -> dict:
        """The innermost visible element matching `css` (whose text is `text`), once the page shows it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            element = self.script(
                """const [css, text] = arguments;
                   const found = [...document.querySelectorAll(css)].filter(
                     e => e.getClientRects().length && (text === null || e.textContent.trim() === text));
                   return found.length ? found[found.length - 1] : null;""",
                css,
                text,
            )
            if element:
                return element
            time.sleep(0.3)
        raise WebDriverError(f"no {css!r}{f' reading {text!r}' if text else ''} after {timeout_s}s")

    def labelled_input(self, label: str, timeout_s: float = 60) -> dict:
        """The input of the form field whose label starts with `label` (Prefect's schema forms)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            element = self.script(
                """const span = [...document.querySelectorAll('.schema-form-property__label')]
                     .find(s => s.textContent.trim().startsWith(arguments[0]));
                   const field = span ? span.closest('.schema-form-property') : null;
                   return field ? field.querySelector('input, textarea, select') : null;""",
                label,
            )
            if element:
                return element
            time.sleep(0.3)
        raise WebDriverError(f"no form field labelled {label!r} after {timeout_s}s")

    def text(self, element: dict) -> str:
        return self.command("GET", f"/element/{element[ELEMENT]}/text")

    def attribute(self, element: dict, name: str) -> str | None:
        return self.command("GET", f"/element/{element[ELEMENT]}/property/{name}")

    def click(self, element: dict) -> None:
        self.script("arguments[0].scrollIntoView({block: 'center'});", element)
        self.command("POST", f"/element/{element[ELEMENT]}/click", {})

    def clear(self, element: dict) -> None:
        self.command("POST", f"/element/{element[ELEMENT]}/clear", {})

    def type(self, element: dict, text: str) -> None:
        self.command("POST", f"/element/{element[ELEMENT]}/value", {"text": text})

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.command("GET", "/screenshot")))
        return path

    def close(self) -> None:
        try:
            self.command("DELETE", "")
        except (OSError, WebDriverError):
            pass
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait(5)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
