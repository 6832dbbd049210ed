"""Deprecated: ``cachex.torchdata`` moved to :mod:`cachex.torch.loader`
(the resumable DataLoader; every public name is importable from :mod:`cachex.torch`).
Each name read here warns (``DeprecationWarning``) naming its new path,
then gives the same object.
"""

from cachex._deprecated import moved_module

__getattr__, __dir__ = moved_module(__name__, "cachex.torch.loader", "cachex.torch")
