"""Suite-wide settings, set before any test module imports the engine (and inherited by the servers and scripts
the tests start)."""
import os

# Each model of the suite is a fused decode signature (~10-60 s of compiling on a cold cache); a test engine runs
# its blocks kernel by kernel unless one is cached (the fused-path tests compile theirs in line).
os.environ.setdefault("RAMLM_FUSED_COMPILE", "cached")

# Under pytest-xdist (`-n 2`, the README's command) two workers share the cores: Numba's OpenMP threads then sleep
# when they wait instead of spinning against the other worker's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config, items):
    """The server tests share package-scoped servers: one worker runs them all (xdist's loadgroup), so each server
    starts once."""
    import pytest
    for item in items:
        if "/entrypoints/server/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.xdist_group("server"))
