"""Drop-ins for Python tools, on cachex's engines: each keeps the
original's names, arguments, defaults and on-disk layout, so a user
changes one import and keeps their caches.

================================  =============================================
:mod:`cachex.dropins.torchcachex`  torchcachex 0.2.0 (``ArrowIPCCacheBackend``,
                                   ``CacheModuleDecorator``); imported as
                                   :mod:`cachex.torchcachex`
:mod:`cachex.dropins.loadit`       loadit 0.0.8 (``LoadIt`` and its utilities);
                                   imported as :mod:`cachex.loadit`
``_not_provided.py``               what a drop-in does with an original's name it
                                   has no equivalent of (:class:`NotProvidedError`)
================================  =============================================

Users import them by the short paths (``from cachex.torchcachex import
ArrowIPCCacheBackend``, ``import cachex.loadit as loadit``): those are
these very modules, under a second name.
"""
