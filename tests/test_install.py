"""scripts/constraints_cpu.txt: the CPU install pins every package to the version CI passed with."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "scripts" / "constraints_cpu.txt"


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"not an exact pin: {line!r}"
        pins[canonicalize_name(name)] = version
    return pins


def _direct_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(name) for name in names]


def test_pins_parse_and_reject_a_range():
    pins = _pins("# header\nFoo_Bar==1.2.3\n\nbaz==0.1  # why\n")
    assert pins == {"foo-bar": "1.2.3", "baz": "0.1"}
    with pytest.raises(AssertionError, match="not an exact pin: 'foo>=1.0'"):
        _pins("foo>=1.0\n")


def test_every_direct_dependency_is_pinned_inside_its_declared_range():
    pins = _pins(CONSTRAINTS.read_text())
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        if name == "torch":  # installed first, alone (install_cpu.sh step 1)
            assert "torch" not in pins
            continue
        assert name in pins, f"{name} is not pinned in {CONSTRAINTS.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject's {requirement}")


def test_the_install_uses_the_pins_and_this_environment_has_them():
    script = (ROOT / "scripts" / "install_cpu.sh").read_text()
    assert 'pip install -c scripts/constraints_cpu.txt -e ".[dev]"' in script
    pins = _pins(CONSTRAINTS.read_text())
    # the suite runs on what the install put in place: the direct dependencies at their pins
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        if name in pins:
            assert metadata.version(requirement.name) == pins[name], requirement.name
