"""The ``wsnmom`` command line run by click in this process, as a finished process.

Starting ``python -m wsnmom`` costs about a second of CPU (imports), more than most
commands' own work: where a test of the same command already runs it as a real process,
the other calls of it go through here. The caller's ``WSNMOM_*`` variables are unset, as
the tests' subprocesses leave them out.
"""

from __future__ import annotations

import os
import subprocess

from click.testing import CliRunner

__all__ = ["wsnmom_in_process"]


def wsnmom_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``wsnmom ARGS`` run in process: its exit status, standard output and error."""
    from wsnmom.cli import cli

    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("WSNMOM_")}
    result = CliRunner().invoke(cli, list(args), env=unset)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["wsnmom", *args], result.exit_code, result.stdout, result.stderr
    )
