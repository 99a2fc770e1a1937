"""Test-session setup: a fresh compile cache, so no test reads what an earlier run stored."""
import os
import tempfile

# Set before dlvm_eq creates its shared cache; subprocesses started by tests inherit it.
os.environ["DLVM_EQ_CACHE_DIR"] = tempfile.mkdtemp(prefix="dlvm_eq-test-cache-")
