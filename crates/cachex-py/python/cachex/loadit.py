"""``cachex.loadit``: the loadit drop-in under the name its users import
(``import cachex.loadit as loadit``), kept as a supported alias, with its
modules ``cachex.loadit.loadit`` and ``cachex.loadit.util`` as loadit has
them. Importing these paths gives the modules of
:mod:`cachex.dropins.loadit` themselves (one module object under two
names), so every name is the same object under both paths.
"""

import sys

from cachex.dropins import loadit as _package
from cachex.dropins.loadit import *  # noqa: F403 - its __all__, for type checkers
from cachex.dropins.loadit import __all__ as __all__
from cachex.dropins.loadit import loadit, util

sys.modules[__name__] = _package
sys.modules[f"{__name__}.loadit"] = loadit
sys.modules[f"{__name__}.util"] = util
