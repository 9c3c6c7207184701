"""The command dispatcher: version, help, unknown options."""

from _helpers import assert_user_error, run_cli


def test_cli_version_and_help():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("perfsim ")
    out = run_cli("--help")
    assert out.returncode == 0 and "COMMAND" in out.stdout
    out = run_cli("--bogus")
    assert_user_error(out.returncode, out.stderr, "--bogus")
