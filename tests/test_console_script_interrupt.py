"""Ctrl-C in the `dlvm-eq` console script while it imports ends the process by SIGINT without a
KeyboardInterrupt traceback (dlvm_eq/console_script.py), as `python -m dlvm_eq.cli` does; any
other program that imports dlvm_eq keeps its SIGINT handler."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what pip writes for pyproject's `dlvm-eq = "dlvm_eq.cli:main"`
SCRIPT = """import sys
from dlvm_eq.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""

PROBE = """import signal, sys
import dlvm_eq
print(signal.getsignal(signal.SIGINT) is signal.SIG_DFL)
"""


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.mark.parametrize("name, default", [("dlvm-eq", True), ("my-program", False)])
def test_only_the_console_script_takes_sigints_default_action(tmp_path, name, default):
    script = tmp_path / name
    script.write_text(PROBE)
    r = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(default)


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3])
def test_ctrl_c_during_the_scripts_imports_prints_no_traceback(tmp_path, delay):
    script = tmp_path / "dlvm-eq"
    script.write_text(SCRIPT)
    p = subprocess.Popen(
        [sys.executable, str(script), "cache", "info"],
        env=dict(_env(), DLVM_EQ_CACHE_DIR=str(tmp_path / "cache")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the interpreter's own start-up runs Python's default handler: wait until our imports run
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60 and p.poll() is None:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            break
        if "_multiarray_umath" in maps:  # numpy, the first import of dlvm_eq's
            break
        time.sleep(0.002)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert p.returncode in (0, -signal.SIGINT), (p.returncode, err)
