"""The demo shop's old import path, kept so existing imports go on working.

The shop now lives with its scenarios and the demo runner in :mod:`loopwarden.demo`
(:mod:`loopwarden.demo.shop`); import it from there.
"""

from loopwarden.demo.shop import Shop, ShopConfig, default_data_dir, shop_tools

__all__ = ["Shop", "ShopConfig", "default_data_dir", "shop_tools"]
