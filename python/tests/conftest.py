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


DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)
