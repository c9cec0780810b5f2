"""The named 50-feature schema of a market observation.

Every index used anywhere in the engine or a plugin is looked up here by name (never typed as a
number in a kernel or a layer). Blocks:

* ``0..37``  price, volatility, volume and order-flow history computed by the market from data up
  to and including bar ``t`` (never after);
* ``38..41`` the agent's own account state, written by the environment at every step;
* ``42..49`` the microstructure block (L1 order book and trades at bar ``t``).
"""

from __future__ import annotations

from types import MappingProxyType

FEATURE_NAMES: tuple[str, ...] = (
    # 0..6 mid log-returns over k bars, in units of the long-run per-bar volatility
    "ret_1", "ret_2", "ret_4", "ret_8", "ret_16", "ret_32", "ret_64",
    # 7..10 realized volatility (log-scaled) and the short/long ratio
    "vol_8", "vol_32", "vol_128", "vol_ratio_8_128",
    # 11..14 distance of the mid from its moving averages, in volatility units
    "ma_dev_8", "ma_dev_32", "ma_dev_128", "ma_cross_8_32",
    # 15..17 oscillators
    "rsi_14", "range_pos_32", "zscore_64",
    # 18..21 volume
    "volume_z_32", "volume_ratio_8_32", "signed_volume_8", "vwap_dev_32",
    # 22..27 order-flow imbalance history
    "ofi_sum_4", "ofi_sum_16", "ofi_sum_64", "ofi_ema_fast", "ofi_ema_slow", "ofi_trend",
    # 28..31 trade flow and book averages
    "trade_sign_imb_16", "trade_count_z_32", "spread_mean_32", "depth_mean_32",
    # 32..37 shape of the recent path
    "drawdown_64", "runup_64", "upside_vol_32", "downside_vol_32", "ret_skew_64", "hl_range_8",
    # 38..41 account state (written by the environment)
    "position", "unrealized_pnl", "holding_time", "working_order",
    # 42..49 microstructure block
    "bid_ask_spread", "l1_depth_imbalance", "queue_pressure", "spread_velocity",
    "depth_change_rate", "trade_arrival_rate", "ofi", "microprice_dev",
)

STATE_DIM: int = len(FEATURE_NAMES)
INDEX: MappingProxyType[str, int] = MappingProxyType({n: i for i, n in enumerate(FEATURE_NAMES)})

ACCOUNT_BLOCK: tuple[int, int] = (INDEX["position"], INDEX["working_order"] + 1)
MICROSTRUCTURE_BLOCK: tuple[int, int] = (INDEX["bid_ask_spread"], INDEX["microprice_dev"] + 1)
MARKET_FEATURES: tuple[int, ...] = tuple(
    i for i in range(STATE_DIM) if not ACCOUNT_BLOCK[0] <= i < ACCOUNT_BLOCK[1]
)


def index_of(*names: str) -> tuple[int, ...]:
    """Indices of the named features; raises ``KeyError`` naming the unknown one."""
    out = []
    for n in names:
        if n not in INDEX:
            raise KeyError(f"unknown feature {n!r}; the schema has {', '.join(FEATURE_NAMES)}")
        out.append(INDEX[n])
    return tuple(out)


if STATE_DIM != 50 or MICROSTRUCTURE_BLOCK != (42, 50) or ACCOUNT_BLOCK != (38, 42):
    raise RuntimeError("feature schema layout is inconsistent")  # guards edits of the table above
