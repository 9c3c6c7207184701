"""The command dispatcher: version, help, unknown options."""

from _helpers import assert_user_error, run_cli


def test_cli_version_and_help():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("perfsim ")
    out = run_cli("--help")
    assert out.returncode == 0 and "COMMAND" in out.stdout
    out = run_cli("--bogus")
    assert_user_error(out.returncode, out.stderr, "--bogus")


def test_an_unknown_flag_is_named_by_its_command():
    """qa1: `perfsim validate --bandwidth 10Mbs` said "perfsim: error: unrecognized arguments"
    (argparse's top parser), where every other mistake names the command."""
    from _helpers import run_cli_here

    for argv, culprit in ((["validate", "--model", "digits-mlp", "--bandwidth", "10Mbs"],
                           "perfsim validate: error: unrecognized arguments: --bandwidth 10Mbs"),
                          (["sweep", "--format", "json"], "perfsim sweep: error: unrecognized arguments: --format"),
                          (["predict", "stray"], "perfsim predict: error: unrecognized arguments: stray")):
        out = run_cli_here(*argv)
        assert_user_error(out.returncode, out.stderr, culprit)
        assert f"(perfsim {argv[0]} --help lists the flags)" in out.stderr
