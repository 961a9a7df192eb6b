"""No import cycle between any two modules, across packages too (import-linter's contract in
pyproject.toml forbids cycles inside each package)."""

import grimp


def test_no_module_imports_itself_through_others():
    """A cycle at run time; imports only for the type checker (under TYPE_CHECKING) are not made then."""
    graph = grimp.build_graph("trainflow", "flows", "tasks", exclude_type_checking_imports=True, cache_dir=None)
    cycles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain:
                cycles.add(" -> ".join((module, *chain)))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))
