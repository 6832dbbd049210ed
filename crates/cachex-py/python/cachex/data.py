"""Deprecated: ``cachex.data`` moved to :mod:`cachex.torch.datasets`
(the datasets; every public name is importable from :mod:`cachex.torch`).
Each name read here warns (``DeprecationWarning``) naming its new path,
then gives the same object.
"""

from cachex._deprecated import moved_module

__getattr__, __dir__ = moved_module(
    __name__,
    "cachex.torch.datasets",
    "cachex.torch",
    {
        "PageIterableDataset": "cachex.torch.PageDataset(path).iterable(batch_size)",
        "BetonIterableDataset": "cachex.torch.BetonDataset(path).iterable(batch_size)",
    },
)
