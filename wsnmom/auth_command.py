"""``wsnmom auth``: write the secrets of the credentials file (``auth.users_file``).

``wsnmom auth hash-password`` asks for a password twice (or reads one line from stdin with
``--stdin``) and prints its scrypt hash for ``password = "..."``; ``wsnmom auth new-token``
prints a new random bearer token and, on stderr, the hash for ``tokens = ["..."]``.
"""

from __future__ import annotations

import sys

import click

from wsnmom.soap_frontend.passwords import hash_password, hash_token, new_token

__all__ = ["auth"]


@click.group("auth")
def auth() -> None:
    """Hash passwords and make tokens for the credentials file (docs/security.md)."""


@auth.command("hash-password")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the password from stdin.")
def hash_password_command(from_stdin: bool) -> None:
    """Print the hash of a password (for ``password = "..."`` in the credentials file)."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")
    click.echo(hash_password(password))


@auth.command("new-token")
def new_token_command() -> None:
    """Print a new bearer token (give it to the client) and, on stderr, its hash (for
    ``tokens = ["..."]`` in the credentials file)."""
    token = new_token()
    click.echo(token)
    click.echo(f"hash for the credentials file: {hash_token(token)}", err=True)


@auth.command("hash-token")
@click.argument("token")
def hash_token_command(token: str) -> None:
    """Print the hash of an existing TOKEN (for ``tokens = ["..."]``)."""
    click.echo(hash_token(token))
