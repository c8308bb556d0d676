"""Packaging: `make run` installs the runtime only, `make test` the test tools too; the
license is an SPDX expression (no setuptools deprecation warning); the default data
directory of older versions is ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(target: str, venv: Path) -> list[str]:
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    out = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "pip install" in line and " -e " in line]


def _extras(install_line: str) -> set[str]:
    match = re.search(r"-e '\.\[([^\]]*)\]'", install_line)
    assert match, install_line
    return {e for e in match.group(1).split(",") if e}


def test_make_run_installs_the_runtime_only(tmp_path: Path) -> None:
    (line,) = _dry_run("run", tmp_path / "fresh-venv")
    extras = _extras(line)
    assert "test" not in extras and "bench" not in extras
    assert "rabbitmq" in extras  # the README's `--adapter amqp://...` works after `make run`


def test_make_test_installs_the_test_tools(tmp_path: Path) -> None:
    (line,) = _dry_run("test", tmp_path / "fresh-venv")
    assert {"test", "rabbitmq"} <= _extras(line)


def test_test_extra_has_the_tools_and_runtime_does_not() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]}
    assert not names & {"pytest", "ruff", "mypy", "zeep", "hypothesis"}
    test_tools = {
        re.split(r"[<>=\[ ]", d)[0].lower() for d in project["optional-dependencies"]["test"]
    }
    assert {"pytest", "ruff", "mypy"} <= test_tools


def test_license_is_an_spdx_expression() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.search(r">=\s*(\d+)", setuptools)
    assert floor and int(floor.group(1)) >= 77  # license expressions: setuptools 77+


def test_served_schemas_are_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "wsnmom.soap_frontend.wsdl" in data["packages"]
    assert data["package-data"]["wsnmom.soap_frontend.wsdl"] == ["*.xsd"]


def test_admin_page_files_are_package_data() -> None:
    """The admin page is served from the installed package (no CDN): every file of
    soap_frontend/admin/ must be in the distribution."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "wsnmom.soap_frontend.admin" in data["packages"]
    assert data["package-dir"]["wsnmom.soap_frontend.admin"] == "soap_frontend/admin"
    patterns = data["package-data"]["wsnmom.soap_frontend.admin"]
    files = sorted(
        p.relative_to(ROOT / "soap_frontend" / "admin")
        for p in (ROOT / "soap_frontend" / "admin").iterdir()
    )
    assert [str(f) for f in files] == ["admin.css", "admin.js", "index.html"]
    assert all(any(f.match(pattern) for pattern in patterns) for f in files)


def test_the_wheel_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """What `make run` installs builds without setuptools' "Package would be ignored"
    warning (data-only folders are packages of their own), and carries the admin page and
    the schemas."""
    import sys
    import zipfile

    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "would be ignored" not in output, output[output.find("would be ignored") - 2000 :][:4000]
    (wheel,) = tmp_path.glob("wsnmom-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("admin.css", "admin.js", "index.html"):
        assert f"wsnmom/soap_frontend/admin/{name}" in names
    assert "wsnmom/soap_frontend/wsdl/b-2.xsd" in names


def test_data_directory_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = subprocess.run(
        ["git", "check-ignore", "-q", "wsnmom-data/store.db"], cwd=ROOT, check=False
    )
    assert result.returncode == 0
