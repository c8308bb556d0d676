"""The shell client's progress output (no gateway needed)."""

from __future__ import annotations

from click.testing import CliRunner


def test_live_count_of_redirected_output() -> None:
    from wsnmom.shell.common import LiveCount

    now = [0.0]
    runner = CliRunner()
    with runner.isolation() as (_, err, _):
        live = LiveCount(enabled=True, every=1.0, clock=lambda: now[0])
        live.add()  # drawn: the first
        live.add(5)  # not yet: within a second
        now[0] = 1.5
        live.add()  # drawn
        live.add()
        live.close()  # the final count, then a newline
        shown = err.getvalue().decode()
    assert shown == (
        "\rreceived 1 notification(s)\rreceived 7 notification(s)\rreceived 8 notification(s)\n"
    )
    with runner.isolation() as (_, err, _):
        quiet = LiveCount(enabled=False)
        quiet.add(3)
        quiet.close()
        assert err.getvalue() == b"" and quiet.count == 3
