"""The checked-in generated code matches the protos: a proto change without
`python generate.py` fails here."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from conftest import PACKAGE_ROOT


def _generate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("muster_generate", PACKAGE_ROOT / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_code_is_what_generate_py_writes() -> None:
    gen = _generate_module()
    stale = gen.stale_files(PACKAGE_ROOT / "src" / "muster_client" / "_gen")
    assert stale == [], (
        f"src/muster_client/_gen is stale ({', '.join(stale)}): run `python generate.py` in clients/python "
        "and commit the result"
    )


def test_generated_imports_are_package_relative() -> None:
    for path in (PACKAGE_ROOT / "src" / "muster_client" / "_gen").glob("*.py*"):
        assert "from muster.v1 import" not in path.read_text(encoding="utf-8"), path
