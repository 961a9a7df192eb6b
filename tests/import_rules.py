"""Import-linter contract types that read imports as Python runs them.

Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first, so whatever a package's
`__init__` imports comes with every one of its submodules. import-linter's graph only has the
import statements, so a chain through a package's `__init__` (`x -> a.b.c`, `a.b -> pydantic`)
is invisible to its own contracts; these add the edge from each module to its package first.
"""

from __future__ import annotations

from importlinter.contracts.forbidden import ForbiddenContract


def _add_package_imports(graph) -> None:
    for module in list(graph.modules):
        if graph.is_module_squashed(module) or "." not in module:
            continue
        package = module.rsplit(".", 1)[0]
        if package in graph.modules:
            graph.add_import(
                importer=module,
                imported=package,
                line_number=0,
                line_contents=f"(importing {module} runs {package}/__init__.py)",
            )


class ForbiddenThroughPackagesContract(ForbiddenContract):
    """A forbidden contract that also follows the imports of every enclosing package's `__init__`."""

    def check(self, graph, verbose: bool):
        _add_package_imports(graph)
        return super().check(graph, verbose)
