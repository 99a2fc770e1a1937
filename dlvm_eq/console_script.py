"""Ctrl-C in the `dlvm-eq` console script (pyproject's [project.scripts]) during its imports:
that script imports this package first, so `dlvm_eq/__init__.py` imports this module before
anything heavy, and from here on SIGINT takes its default action (the process ends, no
KeyboardInterrupt traceback), as `python -m dlvm_eq.cli` does from its first line
(cli/__main__.py). Any other program that imports dlvm_eq keeps its own SIGINT handler.
"""

import os
import signal
import sys

SCRIPTS = ("dlvm-eq", "dlvm-eq-script.py")  # the script pip writes (.exe on Windows)


def running_the_console_script() -> bool:
    main = sys.modules.get("__main__")
    script = os.path.basename(getattr(main, "__file__", None) or "")
    return script.removesuffix(".exe") in SCRIPTS


if running_the_console_script():
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # imported by another thread than the main one: its handler stays
        pass
