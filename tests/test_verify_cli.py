"""dlvm-eq verify-rules: exit codes, the report on stdout, one clear message on errors."""

from pathlib import Path

from dlvm_eq.cli import main

DATA = Path(__file__).parent / "data" / "rules"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_true_identities_exit_0(capsys):
    code, out, err = cli(capsys, "verify-rules", DATA / "identities.egg", "--strict")
    assert code == 0
    assert "0 failed" in out and "0 skipped" in out


def test_verbose_lists_every_rule(capsys):
    code, out, _ = cli(capsys, "verify-rules", DATA / "identities.egg", "-v", "--quick")
    assert code == 0
    assert out.count("identities.egg:") >= 21


def test_false_rule_exits_1_with_file_line_and_counterexample(capsys):
    code, out, _ = cli(capsys, "verify-rules", DATA / "false_identity.egg")
    assert code == 1
    assert "false_identity.egg:5: FAILED" in out and "counterexample" in out


def test_several_files_in_one_run(capsys):
    code, out, _ = cli(capsys, "verify-rules", DATA / "identities.egg", DATA / "shape_unsound.egg")
    assert code == 1
    assert "shape_unsound.egg:2: FAILED" in out and "1 failed" in out


def test_skips_pass_unless_strict(capsys):
    code, out, _ = cli(capsys, "verify-rules", DATA / "unknown.egg")
    assert code == 0 and "3 skipped" in out and "mystery" in out
    code, _, _ = cli(capsys, "verify-rules", DATA / "unknown.egg", "--strict")
    assert code == 1


def test_syntax_error_and_missing_file(capsys):
    code, out, err = cli(capsys, "verify-rules", DATA / "syntax_error.egg")
    assert code == 1 and "syntax_error.egg:" in err and "error" in err
    code, _, err = cli(capsys, "verify-rules", DATA / "nope.egg")
    assert code == 1 and "no such rule file" in err


def test_usage_error_exits_2(capsys):
    code, _, err = cli(capsys, "verify-rules", "--max-assignments", "many")
    assert code == 2 and "--max-assignments" in err
