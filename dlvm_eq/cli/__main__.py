"""`python -m dlvm_eq.cli ARGS`: the dlvm-eq command."""

import sys

from .main import main

sys.exit(main())
