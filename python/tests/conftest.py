# Shared fixtures of memeff's PyTorch tests: the devices to run on (CPU always, CUDA when
# torch sees a GPU). Where torch is not installed every test module skips itself.
import os
import sys

# The tests use the installed memeff (which holds the compiled memeff._C). When pytest runs from
# python/ (e.g. `python -m pytest`), the source folder memeff/ would shadow it: drop that path.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _SOURCE_ROOT]

try:  # each test module skips itself (pytest.importorskip) where torch is absent
    import torch
except ImportError:
    torch = None


try:  # test_properties.py skips itself where hypothesis is absent
    from hypothesis import HealthCheck, settings
except ImportError:
    settings = None

if settings is not None:
    # The property tests' examples per test. "memeff" (the default, and what scripts/test.sh
    # runs): 60, derandomized, so every run checks the same problems; "memeff-explore": 500 new
    # ones each run (saved in .hypothesis/ when one fails). Choose with --hypothesis-profile or
    # MEMEFF_HYPOTHESIS_PROFILE. print_blob: a failure prints the line that replays it.
    settings.register_profile(
        "memeff", max_examples=60, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("memeff-explore", settings.get_profile("memeff"),
                              max_examples=500, derandomize=False)
    settings.load_profile(os.environ.get("MEMEFF_HYPOTHESIS_PROFILE", "memeff"))

DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)
