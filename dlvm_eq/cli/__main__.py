"""`python -m dlvm_eq.cli ARGS`: the dlvm-eq command.

Ctrl-C ends the program at once from its first line on (SIGINT's default action, as
cli/interrupt.py gives each command): while the imports below run, Python's own handler would
print a KeyboardInterrupt traceback instead (seen when SIGINT came 2.5 s in on a loaded machine).
"""

import signal
import sys

signal.signal(signal.SIGINT, signal.SIG_DFL)

from .main import main  # noqa: E402  (after the handler: the imports take seconds when loaded)

sys.exit(main())
