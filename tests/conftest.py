"""Suite-wide settings, set before any test module imports the engine (and inherited by the servers and scripts
the tests start)."""
import os

# Each model of the suite is a fused decode signature (~10-60 s of compiling on a cold cache); a test engine runs
# its blocks kernel by kernel unless one is cached (the fused-path tests compile theirs in line).
os.environ.setdefault("RAMLM_FUSED_COMPILE", "cached")
