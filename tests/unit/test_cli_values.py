"""Option values out of range are refused as the command line is parsed (argparse's error,
exit status 2), from the flag or its environment variable: not a traceback later, nor a
different value (port 99999 bound as 34463, a poll interval of 0 spinning a core)."""

from __future__ import annotations

import pytest

from receiver._cli.main import build_parser

REFUSED = [
    (["serve", "--port", "99999"], "a port is from 0 to 65535"),
    (["serve", "--port", "-1"], "a port is from 0 to 65535"),
    (["serve", "--port", "80.5"], "not a whole number"),
    (["serve", "--workers", "0"], "must be from 1 to 2147483647"),
    (["serve", "--log-level", "bogus"], "is not one of critical"),
    (["sweep", "--batch", "99999999999999999999999"], "must be from 1 to 2147483647"),
    (["failed", "--limit", "\u0665"], "not a whole number"),
    (["replay", "--all-failed", "--limit", "0"], "must be from 1"),
    (["replay", "--all-failed", "--rate", "nan"], "must be a finite number"),
    (["replay", "--job", "-3"], "must be from 1"),
    (["worker", "--poll-interval", "0"], "must be above 0"),
    (["worker", "--poll-interval", "nan"], "must be a finite number"),
    (["worker", "--stale-interval", "-1"], "must be above 0"),
    (["worker", "--grace", "inf"], "must be a finite number"),
    (["worker", "--concurrency", "0"], "must be from 1"),
    (["worker", "--group", "x"], "not a whole number"),
    (["worker", "--metrics-port", "65536"], "a port is from 0 to 65535"),
    (["console", "--port", "70000"], "a port is from 0 to 65535"),
    (["console", "--bulk-rate", "0"], "must be above 0"),
    (["proxy", "--timeout", "inf"], "must be a finite number"),
    (["proxy", "--wait", "-1"], "must be 0 or more"),
    (["proxy", "--max-body-size", "0"], "must be from 1"),
    (["proxy", "--log-level", "loud"], "is not one of critical"),
]


@pytest.mark.parametrize(("argv", "says"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_an_option_out_of_range_is_refused_as_it_is_parsed(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"error: argument {argv[-2]}: " in error, error
    assert says in error.rpartition(f"argument {argv[-2]}: ")[2], error


def test_an_environment_variable_out_of_range_is_refused_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RECEIVER_PORT", "99999")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])
    assert "argument --port: a port is from 0 to 65535, not 99999" in capsys.readouterr().err


def test_values_in_range_are_taken_as_numbers() -> None:
    args = build_parser().parse_args(
        ["worker", "--poll-interval", "0.25", "--grace", "0", "--metrics-port", "0"]
    )
    assert (args.poll_interval, args.grace, args.metrics_port) == (0.25, 0.0, 0)
    args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "WARNING"])
    assert (args.port, args.log_level, args.workers) == (0, "warning", 1)
