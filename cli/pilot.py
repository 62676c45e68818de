"""`pilot`: run programs under the shim and look at the daemon from a user's side."""

from __future__ import annotations

import json
import os
import sys

import click

from pilot.shim import shim_path


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Run CUDA programs through pilotd."""


@main.command("shim-path")
def shim_path_cmd() -> None:
    """Print the absolute path of libpilot.so (for LD_PRELOAD)."""
    try:
        click.echo(str(shim_path()))
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(command: tuple[str, ...]) -> None:
    """Run COMMAND with libpilot.so preloaded: pilot run -- ./app args..."""
    lib = str(shim_path())
    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib} {preload}".strip() if lib not in preload else preload
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise click.ClickException(f"cannot run {command[0]}: {exc.strerror}") from exc


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def sessions(as_json: bool) -> None:
    """List the daemon's sessions."""
    from pilot.cli.client import DaemonUnreachable, query_sessions

    try:
        rows = query_sessions(os.environ.get("PILOT_SOCKET") or None)
    except DaemonUnreachable as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        json.dump(rows, sys.stdout)
        sys.stdout.write("\n")
        return
    click.echo(f"{'SESSION':>7} {'PID':>7} {'UID':>6} {'VGPU':>4} {'DEVICE MiB':>10} {'CALLS':>8}  COMMAND")
    for r in rows:
        click.echo(f"{r['session']:>7} {r['pid']:>7} {r['uid']:>6} {r['vgpu']:>4} "
                   f"{r['device_bytes'] / 2**20:>10.1f} {r['calls']:>8}  {r['cmdline'][:60]}")


if __name__ == "__main__":
    main()
