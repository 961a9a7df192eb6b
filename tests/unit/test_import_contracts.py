"""The dependency rules in pyproject.toml's [tool.importlinter], checked with import-linter."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_training_runtime_loads_no_pydantic_prefect_or_mlflow():
    probe = (
        "import sys, trainflow.runtime; loaded = [m for m in ('pydantic', 'prefect', 'mlflow') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_chain_through_a_package_init_breaks_the_runtime_contract(tmp_path):
    """Importing a submodule runs its package's __init__: what that imports counts."""
    package = tmp_path / "probe"
    for folder, text in {
        "": "",
        "runtime": "",
        "contracts": "import pydantic\n",
    }.items():
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text(text)
    (package / "contracts" / "leaf.py").write_text("CODE = 1\n")
    (package / "runtime" / "codes.py").write_text("from probe.contracts.leaf import CODE\n")
    (tmp_path / "setup.cfg").write_text(
        "[importlinter]\nroot_package = probe\ninclude_external_packages = True\n"
        "contract_types =\n    forbidden_through_packages: tests.import_rules.ForbiddenThroughPackagesContract\n"
        "[importlinter:contract:runtime]\nname = runtime\ntype = forbidden_through_packages\n"
        "source_modules = probe.runtime\nforbidden_modules = pydantic\n"
    )
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [str(lint), "--config", str(tmp_path / "setup.cfg"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "probe.contracts.leaf -> probe.contracts" in done.stdout
