"""The gateway image's documented ``docker run`` line starts, checked without a Docker
engine: the lines of docker/Dockerfile's header are expanded by bash as written, and the
image's ENTRYPOINT and CMD run with the image's ENV, the line's ``-e`` variables, its
WORKDIR and volume (a temporary directory each) in a private network namespace
(``unshare -rn``: only a loopback interface, as in a container), until the image's own
HEALTHCHECK command succeeds and ``/readyz`` answers 200."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from wsnmom.testing.components import missing

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
#: where the image installs the project (its PATH names it): here, this interpreter's bin
IMAGE_BIN = "/opt/wsnmom/bin"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile's last stage, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        if word.upper() == "FROM":
            out = []
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def _documented_lines() -> list[str]:
    """The shell lines of the header comment (``#   export ...``, ``#   docker run ...``),
    without the explanations in parentheses after them."""
    lines = []
    for line in DOCKERFILE.read_text().splitlines():
        if not line.startswith("#   "):
            continue
        command = line.removeprefix("#   ").split("  (")[0].strip()
        if command.startswith(("export ", "docker run ")):
            lines.append(command)
    return lines


def _image_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word != "ENV":
            continue
        for item in shlex.split(rest):
            name, _, value = item.partition("=")
            env[name] = value
    return env


def _docker_run_argv(lines: list[str]) -> list[str]:
    """The documented ``docker run`` command's arguments after bash expanded them."""
    script = "\n".join(
        [
            *(ln for ln in lines if not ln.startswith("docker ")),
            *("set -- " + ln.removeprefix("docker ") for ln in lines if ln.startswith("docker ")),
            'printf "%s\\0" "$@"',
        ]
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


def _parse_run(argv: list[str]) -> tuple[dict[str, str], list[str], str, list[str]]:
    """``run [options] IMAGE [ARGS]``: (the -e variables, the -v volumes, image, args)."""
    assert argv[0] == "run", argv
    env: dict[str, str] = {}
    volumes: list[str] = []
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        option, value = rest[0], rest[1]
        rest = rest[2:]
        if option in ("-e", "--env"):
            name, _, val = value.partition("=")
            env[name] = val if "=" in value else os.environ.get(name, "")
        elif option in ("-v", "--volume"):
            volumes.append(value.split(":")[1])
        else:
            assert option in ("-p", "--publish", "--name"), f"unknown docker run option {option}"
    return env, volumes, rest[0], rest[1:]


#: runs inside the namespace: the container's command, the image's HEALTHCHECK until it
#: succeeds, then /readyz; prints one JSON line
_HARNESS = r"""
import json, subprocess, sys, time, urllib.request
spec = json.loads(sys.argv[1])
serve = subprocess.Popen(spec["command"], env=spec["env"], cwd=spec["cwd"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
result = {"healthy": False, "ready": None, "exited": None}
deadline = time.monotonic() + spec["timeout"]
while time.monotonic() < deadline:
    if serve.poll() is not None:
        result["exited"] = serve.returncode
        break
    check = subprocess.run(spec["healthcheck"], env=spec["env"], capture_output=True)
    if check.returncode == 0:
        result["healthy"] = True
        break
    time.sleep(0.2)
if result["healthy"]:
    while time.monotonic() < deadline and result["ready"] != 200:
        try:
            result["ready"] = urllib.request.urlopen(spec["readyz"], timeout=2).status
        except Exception as exc:
            result["ready"] = repr(exc)
            time.sleep(0.2)
if serve.poll() is None:
    serve.terminate()
result["output"] = serve.communicate(timeout=30)[0]
result["status"] = serve.returncode
print(json.dumps(result))
"""


def test_documented_docker_run_line_starts(tmp_path: Path) -> None:
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode
    ):
        reason = "unshare -rn (a private network namespace) is not available here"
        missing(reason)
    instructions = _instructions()
    image_env = _image_env(instructions)
    extra_env, volumes, image, args = _parse_run(_docker_run_argv(_documented_lines()))
    assert image == "wsnmom" and args == []
    entrypoint = [json.loads(r) for w, r in instructions if w == "ENTRYPOINT"][-1]
    command = [json.loads(r) for w, r in instructions if w == "CMD"][-1]
    healthcheck = [r for w, r in instructions if w == "HEALTHCHECK"][-1]
    workdir = [r for w, r in instructions if w == "WORKDIR"][-1]
    # the volume (and the working directory) of the container, here
    places = {path: tmp_path / f"vol{i}" for i, path in enumerate({*volumes, workdir})}
    for place in places.values():
        place.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(places[workdir]),
        "LANG": "C.UTF-8",
    }
    for name, value in {**image_env, **extra_env}.items():
        value = value.replace("$PATH", env["PATH"]).replace(
            IMAGE_BIN, str(Path(sys.executable).parent)
        )
        env[name] = str(places.get(value, value))
    port = env["WSNMOM_PORT"]
    spec = {
        "command": entrypoint + command,
        "env": env,
        "cwd": str(places[workdir]),
        "healthcheck": json.loads(healthcheck.partition(" CMD ")[2]),
        "readyz": f"http://127.0.0.1:{port}/readyz",
        "timeout": 60,
    }
    done = subprocess.run(
        [
            "unshare",
            "-rn",
            "sh",
            "-c",
            'ip link set lo up && exec "$@"',
            "--",
            sys.executable,
            "-c",
            _HARNESS,
            json.dumps(spec),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    output = result["output"]
    assert result["exited"] is None, output
    assert result["healthy"], output
    assert result["ready"] == 200, output
    assert result["status"] == 0, output  # it stops cleanly on SIGTERM, as `docker stop` asks
    assert "http://localhost:8080/wsn/broker" in output  # the public address from the line
    assert "without public_url" not in output
    # the data went to the volume
    assert any(places[v].iterdir() for v in volumes)
