import pytest
from planner.errors import ProfileError
from planner.textsafe import printable, check_name, MAX_NAME_CHARS
def test_printable_escapes_and_cuts():
    assert printable("a\x1b]0;x\x07b") == "a\\x1b]0;x\\x07b"
    assert printable("a\u202eb") == "a\\u202eb"
    assert printable("one\ntwo\t three") == "one two three"
    s = printable("H" * 10 + "x" * 5000 + "TAIL", 200)
    assert len(s) <= 240 and s.startswith("H" * 10) and s.endswith("TAIL") and "characters cut" in s
def test_check_name():
    assert check_name("layers.0.attn", "layer name", ProfileError, "f:1") == "layers.0.attn"
    for bad in ["", "a\nb", "a\x1bb", "x" * (MAX_NAME_CHARS + 1), "a\u202eb"]:
        with pytest.raises(ProfileError) as e:
            check_name(bad, "layer name", ProfileError, "f:3")
        assert "f:3" in str(e.value) and "\n" not in str(e.value) and "\x1b" not in str(e.value)


@pytest.mark.parametrize("args, says", [
    (["partition"], "Missing argument 'PROFILE.csv'; see `pplan partition --help`"),
    (["partition", "x.csv", "--bogus"], "No such option: --bogus"),
    (["nosuch"], "No such command 'nosuch'; see `pplan --help`"),
    (["simulate", "p.json", "--microbatches", "two"], "Invalid value for '--microbatches'"),
])
def test_usage_errors_are_one_line(pplan, args, says):
    """Click's four-line usage block (Usage:, Try, blank, Error:) becomes pplan's one error line."""
    code, out, err = pplan(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("pplan: error: ") and says in err, err


def test_error_line_escapes_what_a_file_said(pplan, tmp_path):
    """A terminal escape inside a value the user gave (or a file held) reaches stderr escaped."""
    code, _, err = pplan("partition", str(tmp_path / "p.csv"), "-n", "2", "--global-batch", "8", "--memory", "1\x1b]0;x\x07GB")
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "\\x1b" in err
