"""``cachex.torchcachex``: the torchcachex drop-in under the name its users
import (``from cachex.torchcachex import ArrowIPCCacheBackend``), kept as a
supported alias. The module is :mod:`cachex.dropins.torchcachex` itself:
importing this path gives that very module object, so its names, private
ones included, are the same objects under both paths.
"""

import sys

from cachex.dropins import torchcachex as _module
from cachex.dropins.torchcachex import *  # noqa: F403 - its __all__, for type checkers
from cachex.dropins.torchcachex import __all__ as __all__

sys.modules[__name__] = _module
