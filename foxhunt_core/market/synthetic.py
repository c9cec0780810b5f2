r"""The embedded synthetic limit-order-book market (L1 book and trades, one bar per step).

:func:`simulate` draws ``settings.bars`` bars from the model below with
``np.random.default_rng(settings.seed)`` and returns a :class:`MarketData` with raw features.
Prices are in ticks inside the model (``settings.tick_size`` converts them).

The model
---------
**Regimes.** ``k_t in {calm, trend-up, trend-down, volatile}`` is a Markov chain: with
probability ``p = regime_switch_prob`` per bar it leaves its regime for one of the other three,
uniformly. Each regime sets a flow drift ``mu_k``, flow and noise multipliers, the spread,
the depth level and the trade rate (tables ``FLOW_DRIFT`` ... ``TRADE_RATE`` below).

**Latent order flow.** The depth-normalized order-flow imbalance is AR(1)::

    x_t = phi * x_{t-1} + (1 - phi) * mu_k + sf_k * (sqrt(lam) * nu_{t-1} + sqrt(1 - lam) * eps_t)

with ``phi = ofi_persistence``. The part ``nu_{t-1}`` of the innovation is already visible in
the book at the close of bar ``t-1`` (resting orders arrive before they trade), so the depth
imbalance *leads* the flow. The flow realized over bar ``t``, in shares, is::

    OFI_t = depth_t * n_t,        n_t = x_t + s_eta * eta_t

where ``depth_t = (bid_size_t + ask_size_t) / 2`` is the recorded L1 depth (below).

**Price.** Linear OFI impact normalized by L1 depth (Cont, Kukanov and Stoikov 2014,
``dP = beta * OFI / depth``), of which market makers price in, one bar ahead, all but a share
``alpha`` of the flow they can forecast, plus regime-scaled noise, on a latent efficient
price::

    P*_t = P*_{t-1} + beta * (n_t - (1 - alpha) f_{t-1}) + noise_ticks * sn_k * zeta_t     (ticks)

with ``beta = ofi_impact`` and ``f_{t-1} = E_{t-1}[x_t] = phi x_{t-1} + (1 - phi) mu_k +
sf_k sqrt(lam) nu_{t-1}``, the flow expected from the flow's persistence and from what the book
shows of the next innovation (below). The quoted mid is ``P*`` rounded to the tick grid when
the spread ``S_t`` (whole ticks) is even and to the half-tick grid when it is odd, so that
``bid = mid - S/2`` and ``ask = mid + S/2`` are on the tick grid.

**The edge** is the part of the next bar's price change that this predicts,
``beta * alpha * f_t``. ``edge_snr`` sets it: in the calm regime the standard deviation of
``beta * alpha * f_t`` over that of the rest of the change,
``sqrt(beta^2 (1 - lam + s_eta^2) + noise_ticks^2)``, is ``edge_snr``, which fixes ``alpha``
(:func:`price_alpha`). ``edge_snr = 0`` is a market whose price is a martingale; the book and
the flow still behave as below. The default, 0.55, is a forecastable share of the bar's
variance of 23 % (``snr^2 / (1 + snr^2)``, ``alpha`` 0.93); since a bar moves about as much as
the spread, a least-squares forecast that trades only when it beats the cost seldom trades and
earns an annualized Sharpe ratio of 1-3 on the test split (README,
``tests/market/test_market_synthetic.py``).

**The bar.** One hour of a 7-hour session (13:00-20:00 UTC) on weekdays from 1990-01-01:
:data:`BAR`, 1 826 bars a year. The scale is that of a thinly traded instrument: with the default
``noise_ticks`` (1 tick of 1 bp) a bar moves about 1.3 ticks, as much as its spread (1-2 ticks),
so what an order pays matters as much as what it forecasts.
"""

from __future__ import annotations

import numpy as np

from foxhunt_core.config import MarketSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import compute_features
from foxhunt_core.market.interval import BarInterval

CALM, TREND_UP, TREND_DOWN, VOLATILE = 0, 1, 2, 3
REGIME_NAMES: tuple[str, ...] = ("calm", "trend_up", "trend_down", "volatile")

# per-regime tables, indexed by regime
FLOW_DRIFT = np.array([0.0, 0.2, -0.2, 0.0])  # mu_k, depth-normalized OFI units
FLOW_VOL = np.array([1.0, 1.0, 1.0, 1.5])  # sf_k
NOISE_MULT = np.array([1.0, 1.0, 1.0, 2.0])  # sn_k
SPREAD_EXTRA = np.array([0.1, 0.2, 0.2, 1.0])  # spread_k, mean extra ticks above one
DEPTH_MEAN = np.array([120.0, 90.0, 90.0, 50.0])  # Dbar_k, shares
TRADE_RATE = np.array([6.0, 9.0, 9.0, 16.0])  # rate_k, trades per bar

BOOK_LEAD = 0.3  # lam: share of the flow innovation shown in the book one bar ahead
OFI_NOISE = 0.35  # s_eta
BOOK_GAIN, BOOK_NOISE = 0.6, 0.3  # kappa, s_I
DEPTH_PERSIST, DEPTH_VOL = 0.95, 0.12  # rho, sd
SPREAD_REDRAW = 0.3
TRADE_SIZE = 5.0
TRADE_SIGN_GAIN = 1.0  # gamma
BAR_NS = 3_600_000_000_000  # one-hour bars
SESSION_BARS, SESSION_OPEN_H = 7, 13  # a 7-hour session, 13:00-20:00 UTC, on weekdays
T0_NS = 631_152_000_000_000_000  # 1990-01-01T00:00:00Z, a Monday
BAR = BarInterval(seconds=3600.0, bars_per_year=SESSION_BARS * 5 * 365.25 / 7, source="synthetic")


def timestamps(t_len: int) -> np.ndarray:
    """Close times of ``t_len`` hourly session bars of weekdays from :data:`T0_NS` (int64 ns)."""
    i = np.arange(t_len, dtype=np.int64)
    day, hour = np.divmod(i, SESSION_BARS)
    week, weekday = np.divmod(day, 5)
    return T0_NS + ((week * 7 + weekday) * 24 + SESSION_OPEN_H + hour + 1) * BAR_NS


def price_alpha(settings: MarketSettings) -> float:
    """The share ``alpha`` of the forecastable flow left in the price for ``edge_snr``
    (module docstring): ``beta alpha std(f) = snr * std(rest)`` in the calm regime, where
    ``std(f)^2 = phi^2 / (1 - phi^2) + lam`` (the innovation of ``x`` has unit variance)."""
    phi, beta = settings.ofi_persistence, settings.ofi_impact
    f_std = np.sqrt(phi**2 / (1.0 - phi**2) + BOOK_LEAD)
    rest = np.sqrt(beta**2 * (1.0 - BOOK_LEAD + OFI_NOISE**2) + settings.noise_ticks**2)
    return float(settings.edge_snr * rest / (beta * f_std))


def _regimes(rng: np.random.Generator, t_len: int, p: float) -> np.ndarray:
    switch = rng.random(t_len) < p
    switch[0] = False
    hop = rng.integers(1, len(REGIME_NAMES), size=t_len)
    return (np.cumsum(np.where(switch, hop, 0)) % len(REGIME_NAMES)).astype(np.int8)


def _ar1(innov: np.ndarray, phi: float, x0: float) -> np.ndarray:
    """``x_t = phi * x_{t-1} + innov_t`` (a first-order recursion; sequential by nature)."""
    out = []
    append = out.append
    x = x0
    for v in innov.tolist():
        x = phi * x + v
        append(x)
    return np.asarray(out, dtype=np.float64)


def _sticky(values: np.ndarray, redraw: np.ndarray) -> np.ndarray:
    """``values`` held constant between the bars where ``redraw`` is true (bar 0 always)."""
    redraw = redraw.copy()
    redraw[0] = True
    last = np.maximum.accumulate(np.where(redraw, np.arange(values.shape[0]), 0))
    return values[last]


def simulate(settings: MarketSettings) -> MarketData:
    """Draw the synthetic market of ``settings`` (deterministic in ``settings.seed``)."""
    rng = np.random.default_rng(settings.seed)
    t_len = settings.bars
    phi, beta = settings.ofi_persistence, settings.ofi_impact

    regime = _regimes(rng, t_len, settings.regime_switch_prob)
    k = regime.astype(np.intp)

    # latent flow x_t and the book-visible part of its next innovation
    nu = rng.standard_normal(t_len)
    eps = rng.standard_normal(t_len)
    lead = np.zeros(t_len)
    lead[1:] = np.sqrt(BOOK_LEAD) * nu[:-1]
    innov = (1.0 - phi) * FLOW_DRIFT[k] + FLOW_VOL[k] * (lead + np.sqrt(1.0 - BOOK_LEAD) * eps)
    x = _ar1(innov, phi, 0.0)
    n = x + OFI_NOISE * rng.standard_normal(t_len)

    # the flow expected one bar ahead (persistence and the book's lead), of which market makers
    # price in all but the share alpha
    expected_next = phi * x + (1.0 - phi) * FLOW_DRIFT[k] + FLOW_VOL[k] * np.sqrt(BOOK_LEAD) * nu
    priced = np.zeros(t_len)
    priced[1:] = (1.0 - price_alpha(settings)) * expected_next[:-1]
    # efficient price in ticks, spread, quoted mid
    p_star = settings.start_price / settings.tick_size + np.cumsum(
        beta * (n - priced) + settings.noise_ticks * NOISE_MULT[k] * rng.standard_normal(t_len)
    )
    extra = rng.poisson(SPREAD_EXTRA[k] + 0.15 * np.abs(x))
    regime_change = np.concatenate([[True], regime[1:] != regime[:-1]])
    spread = _sticky(1 + extra, (rng.random(t_len) < SPREAD_REDRAW) | regime_change)
    odd = spread % 2 == 1
    mid_ticks = np.where(odd, np.floor(p_star) + 0.5, np.round(p_star))
    if np.any(mid_ticks - spread / 2 <= 0):
        raise ValueError("the simulated price reached zero: raise start_price or lower noise")

    # depth level and its flow tilt
    log_depth = _ar1(
        (1.0 - DEPTH_PERSIST) * np.log(DEPTH_MEAN[k]) + DEPTH_VOL * rng.standard_normal(t_len),
        DEPTH_PERSIST,
        np.log(DEPTH_MEAN[CALM]),
    )
    depth = np.exp(log_depth)
    tilt = np.tanh(BOOK_GAIN * expected_next + BOOK_NOISE * rng.standard_normal(t_len))
    bid_size = np.maximum(np.round(depth * (1.0 + 0.8 * tilt)), 1.0)
    ask_size = np.maximum(np.round(depth * (1.0 - 0.8 * tilt)), 1.0)

    # trades
    count = rng.poisson(TRADE_RATE[k] * (1.0 + 0.25 * np.abs(n)))
    buys = rng.binomial(count, 1.0 / (1.0 + np.exp(-TRADE_SIGN_GAIN * n)))
    buy_vol = np.ceil(rng.gamma(buys.astype(np.float64), TRADE_SIZE))
    sell_vol = np.ceil(rng.gamma((count - buys).astype(np.float64), TRADE_SIZE))

    tick = settings.tick_size
    data = MarketData(
        timestamp=timestamps(t_len),
        mid=mid_ticks * tick,
        bid=(mid_ticks - spread / 2) * tick,
        ask=(mid_ticks + spread / 2) * tick,
        bid_size=bid_size,
        ask_size=ask_size,
        trade_volume=buy_vol + sell_vol,
        trade_count=count.astype(np.float64),
        signed_volume=buy_vol - sell_vol,
        ofi=n * 0.5 * (bid_size + ask_size),
        regime=regime,
        features=np.zeros((t_len, 50), dtype=np.float32),
        tick_size=tick,
        source=f"synthetic(seed={settings.seed})",
    )
    data.features = compute_features(data)
    return data
