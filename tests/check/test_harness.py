"""Bad input to the harness gets a clear answer, never a crash (issue 10 §5).

A target that raises, returns the wrong shape, dtype or type, or NaN for finite inputs is a
failed case with that message; an unknown name lists the registry; an unimportable module
names the import error; Ctrl-C leaves a partial report; failures write replay files that
``--replay`` re-runs; checking a NumPy target never imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from exactattn.commands import check as cli
from exactattn.testing import assert_attention_close
from tests.optional import requires

torch = requires("torch")
F = torch.nn.functional


def _fails_with(fn, pattern, **keywords):
    with pytest.raises(AssertionError, match=pattern):
        keywords.setdefault("dtypes", ("float32",))
        assert_attention_close(fn, examples=5, dropout_probe=False, **keywords)


def test_a_raising_target_is_a_failed_case():
    def boom(q, k, v, **kw):
        raise RuntimeError("kernel exploded")

    _fails_with(boom, r"raised RuntimeError: kernel exploded")


def test_wrong_shape_dtype_type_and_nan_are_failed_cases():
    _fails_with(lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw)[..., :1, :],
                r"y has shape .*; expected")  # fmt: skip
    _fails_with(lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw).double(),
                r"y has dtype float64; expected float32", dtypes=("float32",))  # fmt: skip
    _fails_with(lambda q, k, v, **kw: [1, 2], r"y is a list; expected a tensor")
    _fails_with(lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw) * math_nan(),
                r"is nan for finite inputs")  # fmt: skip


def math_nan():
    return float("nan")


def test_a_target_that_takes_nothing_is_not_a_pass():
    with pytest.raises(AssertionError, match=r"no case was checked.*does not take float32"):
        assert_attention_close(
            F.scaled_dot_product_attention,
            examples=5,
            supports="dtypes=float16",
            dtypes=("float32",),
        )


def test_unknown_names_and_import_errors_are_clear(capsys):
    assert cli.main(["no-such-kernel"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'no-such-kernel'; available:" in err and "sdpa-math" in err
    assert cli.main(["no_such_package.attn:forward"]) == 2
    assert "ModuleNotFoundError: No module named 'no_such_package'" in capsys.readouterr().err
    assert cli.main(["exactattn.core.masks:no_such_function"]) == 2
    assert "has no attribute 'no_such_function'" in capsys.readouterr().err
    assert cli.main(["sdpa", "--claim", "input=fp17"]) == 2
    assert "unknown number format 'fp17'" in capsys.readouterr().err


def _user_target(tmp_path, body: str) -> str:
    path = tmp_path / "user_kernel.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:attention"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_failures_write_replay_files_and_reports(tmp_path, capsys):
    target = _user_target(
        tmp_path,
        """
        import torch.nn.functional as F

        def attention(q, k, v, **kw):
            return F.scaled_dot_product_attention(q, k, v, **kw) * 1.001
        """,
    )
    report, saved = tmp_path / "report", tmp_path / "saved"
    argv = [target, "--examples", "20", "--dtypes", "float32", "--no-probes"]
    assert cli.main([*argv, "--report", str(report), "--save-failures", str(saved)]) == 1
    out = capsys.readouterr().out
    assert "FAIL " in out and "worst element: y[" in out and "replay: exactattn check" in out
    (replay,) = saved.glob("*.json")
    assert json.loads(replay.read_text())["expect"]["spec"]["convention"] == "sdpa"
    data = json.loads((report / "report.json").read_text())
    assert len(data["failures"]) == 1 and data["variants"][0]["failed"] >= 1  # kept running
    assert "## Failures" in (report / "report.md").read_text()
    assert cli.main(["--replay", str(replay)]) == 1
    assert "FAIL " in capsys.readouterr().out
    assert cli.main(["sdpa", "--replay", str(replay)]) == 0  # the real SDPA passes the case


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_ctrl_c_leaves_a_partial_report(tmp_path, capsys):
    target = _user_target(
        tmp_path,
        """
        import torch.nn.functional as F

        calls = [0]

        def attention(q, k, v, **kw):
            calls[0] += 1
            if calls[0] == 6:
                raise KeyboardInterrupt
            return F.scaled_dot_product_attention(q, k, v, **kw)
        """,
    )
    report = tmp_path / "report"
    argv = [target, "--examples", "50", "--no-probes", "--no-determinism", "--no-baselines"]
    assert cli.main([*argv, "--report", str(report)]) == 130
    assert "INTERRUPTED" in capsys.readouterr().out
    data = json.loads((report / "report.json").read_text())
    assert data["interrupted"] and 0 < data["examples"] < 50
    assert "interrupted: partial" in (report / "report.md").read_text()


def test_checking_a_numpy_target_never_imports_torch():
    code = (
        "import sys\n"
        "from exactattn.commands.check import main\n"
        "rc = main(['np-fp32', '--examples', '5'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "np-fp32" in done.stdout


def test_list_shows_availability_with_reasons(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "sdpa-cudnn" in out and "CUDA device" in out
    assert "flash-attn" in out and "unavailable" in out
