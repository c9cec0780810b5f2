"""What trading a market costs: spreads from its quotes or an estimate, fees, and user overrides.

* **Spread.** L1 data and the synthetic market have quotes: a market order pays the half spread
  they show. OHLCV bars have none: the loader estimates it from the high-low range (Corwin and
  Schultz 2012, :mod:`foxhunt_core.market.loaders`), a noisy figure that can be far from the
  instrument's quoted spread. ``market.half_spread_bps`` replaces the spread of either with a
  constant half spread in bps of the mid (``bid/ask = mid (1 -/+ h)``); the spread features keep
  what the data showed (they are features of the bars), only what orders pay changes.
* **Fees.** ``env.taker_fee_bps`` / ``env.maker_fee_bps`` by default; ``market.fee_bps`` replaces
  both with one fee per unit of notional filled.

:func:`apply_costs` returns the bars, the environment settings to trade them with, and a line
that says where each cost came from (written beside every evaluation).
"""

from __future__ import annotations

import numpy as np

from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.market.data import MarketData


def mean_half_spread_bps(data: MarketData) -> float:
    """The mean half spread of ``data`` in bps of the mid."""
    return float(np.mean((data.ask - data.bid) / (2.0 * data.mid)) * 1e4)


def apply_costs(data: MarketData, m: MarketSettings, env: EnvSettings) -> tuple[MarketData, EnvSettings, str]:
    """``data`` and ``env`` with the overrides of ``m`` applied, and the costs in words."""
    if m.half_spread_bps is not None:
        h = m.half_spread_bps * 1e-4
        data = data.replace(bid=data.mid * (1.0 - h), ask=data.mid * (1.0 + h))
        spread = f"half spread {m.half_spread_bps:g} bp (set)"
    elif m.source == "file" and m.format == "ohlcv":
        spread = (f"half spread estimated from the high-low range (Corwin-Schultz), mean "
                  f"{mean_half_spread_bps(data):.2f} bp: set market.half_spread_bps if it is known")
    else:
        spread = f"half spread from the quotes, mean {mean_half_spread_bps(data):.2f} bp"
    if m.fee_bps is not None:
        env = env.model_copy(update={"taker_fee_bps": m.fee_bps, "maker_fee_bps": m.fee_bps})
        fee = f"fee {m.fee_bps:g} bp (set)"
    else:
        fee = f"taker fee {env.taker_fee_bps:g} bp, maker fee {env.maker_fee_bps:g} bp"
    return data, env, f"{spread}; {fee}"
