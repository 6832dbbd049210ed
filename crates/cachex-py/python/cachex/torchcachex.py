"""``cachex.torchcachex``: the torchcachex drop-in under the name its users
import (``from cachex.torchcachex import ArrowIPCCacheBackend``), kept as a
supported alias, with its modules ``cachex.torchcachex.backend``,
``cachex.torchcachex.decorator`` and ``cachex.torchcachex.utils`` as
torchcachex has them. Importing these paths gives the modules of
:mod:`cachex.dropins.torchcachex` themselves (one module object under two
names), so every name, private ones included, is the same object under
both paths.
"""

import sys

from cachex.dropins import torchcachex as _package
from cachex.dropins.torchcachex import *  # noqa: F403 - its __all__, for type checkers
from cachex.dropins.torchcachex import __all__ as __all__
from cachex.dropins.torchcachex import backend, decorator, utils

sys.modules[__name__] = _package
sys.modules[f"{__name__}.backend"] = backend
sys.modules[f"{__name__}.decorator"] = decorator
sys.modules[f"{__name__}.utils"] = utils
