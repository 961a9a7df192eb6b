"""Two commands starting at once on a new PREFECT_HOME both get a temporary Prefect server: the
first sets its SQLite database up, the other waits for that instead of setting it up too."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from trainflow.prefect.server import TemporaryServer

pytestmark = pytest.mark.integration


def answers(server: TemporaryServer) -> bool:
    with urllib.request.urlopen(f"{server.api_url}/health", timeout=30) as response:
        return response.status == 200


@pytest.mark.timeout(600)
def test_two_temporary_servers_start_together_on_a_new_prefect_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    done = threading.Event()
    results: dict[int, object] = {}

    def command(index: int) -> None:
        # as a command does: its server lives until it is done (it dies with the thread that started it)
        server = TemporaryServer()
        try:
            server.start(timeout_s=480)
            results[index] = answers(server)
            done.wait(600)
            results[index] = results[index] and answers(server)  # still up once both had started
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[index] = exc
        finally:
            server.stop()

    threads = [threading.Thread(target=command, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    try:
        while len(results) < 2 and all(thread.is_alive() for thread in threads):
            threads[0].join(0.5)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert results == {0: True, 1: True}
    assert (tmp_path / "prefect" / "prefect.db").exists()  # the one database a person reopens later
