"""``wsnmom adapters`` and ``wsnmom plugins``: what is installed, and why something is not.

:func:`install` adds both commands to the root click group and lets plugins add theirs
through the ``wsnmom_register_commands`` hook.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click
from wsnmom.core.plugins import PluginManager, get_plugin_manager


def _capabilities(caps: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(caps):
        value = getattr(caps, f.name)
        out[f.name] = getattr(value, "name", value) if f.name == "syntax" else value
    return out


def adapter_rows(pm: PluginManager) -> list[dict[str, Any]]:
    """One row per registered scheme: class, extra, capabilities and declared options, or
    the import error."""
    # imported here: the listing loads the adapters anyway, ``wsnmom --help`` need not
    from wsnmom.core.adapter_options import describe_options

    rows: list[dict[str, Any]] = []
    for entry in pm.adapters.entries():
        row: dict[str, Any] = {
            "scheme": entry.scheme,
            "adapter": None,
            "target": entry.target_name,
            "extra": entry.extra,
            "plugin": entry.registered_by,
            "available": False,
            "capabilities": None,
            "options": None,
            "error": None,
        }
        try:
            cls = pm.adapters.load(entry.scheme)
        except Exception as exc:  # show why, don't fail the listing
            row["error"] = f"{type(exc).__name__}: {exc}"
        else:
            row["adapter"] = cls.name
            row["available"] = True
            row["capabilities"] = _capabilities(cls.capabilities)
            declared = cls.declared_options
            row["options"] = (
                [dataclasses.asdict(d) for d in describe_options(declared)] if declared else []
            )
        rows.append(row)
    return rows


@click.command("adapters")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def adapters_command(as_json: bool) -> None:
    """List installed adapters: URL schemes, extras, capabilities and options."""
    pm = get_plugin_manager()
    rows = adapter_rows(pm)
    failures = pm.failures()
    if as_json:
        click.echo(json.dumps({"adapters": rows, "failed_plugins": failures}, indent=2))
        return
    if not rows:
        click.echo("no adapters registered")
    for row in rows:
        if row["available"]:
            status, extra = f"{row['adapter']}  installed", ""
        else:
            status = "NOT INSTALLED"
            extra = f'  (pip install "wsnmom[{row["extra"]}]")' if row["extra"] else ""
        click.echo(f"{row['scheme']}://  {status}  {row['target']}{extra}")
        if row["error"]:
            click.echo(f"    why: {row['error']}")
        else:
            caps = row["capabilities"] or {}
            click.echo("    " + ", ".join(f"{k}={v}" for k, v in caps.items()))
            if row["options"]:
                names = ", ".join(option["name"] for option in row["options"])
                click.echo(f"    options: {names}")
    for name, error in sorted(failures.items()):
        click.echo(f"plugin {name!r} could not be loaded: {error}")


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plugins_command(as_json: bool) -> None:
    """List plugins: name, version, hooks they implement, schemes they register."""
    infos = get_plugin_manager().plugins()
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        return
    for info in infos:
        kind = "builtin" if info.builtin else "external"
        version = f" {info.distribution} {info.version}" if info.distribution else ""
        if info.blocked:
            click.echo(f"{info.name}  [{kind}] BLOCKED (WSNMOM_BLOCKED_PLUGINS)")
            continue
        if info.error:
            click.echo(f"{info.name}  [{kind}]{version} FAILED: {info.error}")
            continue
        click.echo(f"{info.name}  [{kind}]{version}  {info.module}")
        if info.hooks:
            click.echo(f"    hooks: {', '.join(info.hooks)}")
        if info.schemes:
            click.echo(f"    schemes: {', '.join(info.schemes)}")


def install(cli: click.Group) -> click.Group:
    """Add ``adapters`` and ``plugins`` to ``cli`` and let plugins add their commands."""
    cli.add_command(adapters_command)
    cli.add_command(plugins_command)
    get_plugin_manager().register_commands(cli)
    return cli
