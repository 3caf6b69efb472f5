"""tools/mutation.py's bookkeeping: its targets exist and every equivalent mutant it lists is one it makes."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_target_is_a_file_and_every_equivalent_entry_names_a_current_mutant():
    tool = _tool()
    made = set()
    for path, target in tool.TARGETS.items():
        assert (ROOT / path).is_file(), path
        made |= {(m.path, m.context, m.original, m.replacement) for m in tool.mutants(path, target)}
    stale = [key for key in tool.EQUIVALENT if key not in made]
    assert not stale, f"EQUIVALENT entries no mutant matches any more (drop or update them): {stale}"
