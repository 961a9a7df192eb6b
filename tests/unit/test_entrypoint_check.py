"""Reading a training script before launch: it compiles, and it reaches trainflow.runtime (or
reading cannot tell, and it is not refused)."""

from __future__ import annotations

import pytest

from trainflow.entrypoint_check import compile_problem, imports_runtime


@pytest.mark.parametrize(
    "source",
    [
        "import trainflow.runtime as tf\n",
        "import trainflow.runtime\n",
        "from trainflow import runtime\n",
        "from trainflow.runtime import init\n",
        "from trainflow.runtime.checkpointing import save\n",
        "def main():\n    import trainflow.runtime as tf\n    return tf\n",
        "try:\n    from trainflow import runtime as tf\nexcept ImportError:\n    tf = None\n",
    ],
)
def test_every_way_of_importing_the_runtime_counts(tmp_path, source):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert imports_runtime(script) is True


def test_the_runtime_imported_by_a_module_of_the_scripts_own_counts(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "loop.py").write_text("import trainflow.runtime as tf\n")
    (tmp_path / "train.py").write_text("import torch\nfrom helpers.loop import tf\n")
    assert imports_runtime(tmp_path / "train.py") is True


def test_a_script_of_the_standard_library_and_torch_alone_never_imports_it(tmp_path):
    (tmp_path / "data.py").write_text("import os\n")
    (tmp_path / "train.py").write_text("import os\nimport torch\nimport torch.distributed as dist\nimport data\n")
    assert imports_runtime(tmp_path / "train.py") is False


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\ntf = importlib.import_module('trainflow.runtime')\n",
        "tf = __import__('trainflow.runtime')\n",
        "import runpy\nrunpy.run_module('mine')\n",
        "import a_module_installed_only_on_the_workers\n",
    ],
)
def test_what_reading_cannot_tell_is_left_undecided(tmp_path, source):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert imports_runtime(script) is None


def test_a_syntax_error_names_the_file_the_line_and_the_message(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\n\nif True\n    pass\n")
    problem = compile_problem(script)
    assert problem is not None and problem.line == f"{script}:3: SyntaxError: expected ':'"
    script.write_text("import os\n")
    assert compile_problem(script) is None
