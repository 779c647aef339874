"""memeff: fused scaled-dot-product attention with in-kernel dropout, for GPUs and CPUs.

The PyTorch integration lives in :mod:`memeff.torch` (``import memeff.torch``); importing this
package alone loads nothing, so it works without torch.
"""

__all__ = ["__version__"]

try:
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("memeff")
except Exception:  # not installed as a distribution (e.g. a source tree on sys.path)
    __version__ = "unknown"
