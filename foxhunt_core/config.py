"""Run settings: every knob of a run, as pydantic models with a description per field.

A flag file's ``run:`` block overrides fields of :class:`RunSettings`; the plugin framework adds
one options model per installed plugin beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MarketSettings(_Strict):
    """The embedded synthetic limit-order-book market."""

    bars: int = Field(60_000, ge=2_000, description="Number of bars (time steps) to simulate.")
    seed: int = Field(7, description="Seed of the market simulation (independent of the run seed).")
    train_fraction: float = Field(0.7, gt=0.1, lt=0.95, description="Leading share of bars for training.")
    val_fraction: float = Field(0.1, ge=0.0, lt=0.5, description="Share of bars after training for validation; the rest is test.")
    tick_size: float = Field(0.01, gt=0, description="Price tick.")
    start_price: float = Field(100.0, gt=0, description="Initial mid price.")
    ofi_impact: float = Field(0.6, gt=0, description="Price impact per unit of depth-normalized order-flow imbalance, in ticks (Cont-Kukanov-Stoikov linear model).")
    ofi_persistence: float = Field(0.7, ge=0, lt=1, description="AR(1) coefficient of the latent order-flow imbalance.")
    noise_ticks: float = Field(1.0, ge=0, description="Standard deviation of the non-order-flow mid noise, in ticks.")
    regime_switch_prob: float = Field(0.002, ge=0, le=0.5, description="Per-bar probability of leaving the current regime.")
    edge_snr: float = Field(0.55, ge=0, le=1.0, description="The synthetic market's edge: standard deviation of the next bar's expected price change given the order-flow state over that of the rest of the change (foxhunt_core.market.synthetic); 0 is a market without edge.")
    source: Literal["synthetic", "file"] = Field("synthetic", description="Where the bars come from: the synthetic market above or a data file (path, format).")
    path: str | None = Field(None, description="source file: the OHLCV bar file, or for format l1 the quotes file (CSV or Parquet); in a flag file relative to the flag file.")
    trades_path: str | None = Field(None, description="source file, format l1: the trades file (relative like path).")
    format: Literal["ohlcv", "l1"] = Field("ohlcv", description="source file: OHLCV bars, or L1 quotes plus trades resampled to bars of bar_seconds (foxhunt_core.market.loaders).")
    bar_seconds: float | None = Field(None, gt=0, description="Bar length in seconds: for l1 the resampling bar (default 60); otherwise overrides the interval detected from the timestamps.")
    bars_per_year: float | None = Field(None, gt=0, description="Bars in a year, the factor of every annualized figure; default: detected from the timestamps (foxhunt_core.market.interval).")
    half_spread_bps: float | None = Field(None, ge=0, description="source file: the half spread paid by a market order, bps of the mid, replacing the quotes (l1) or the high-low estimate (ohlcv) of foxhunt_core.market.costs.")
    fee_bps: float | None = Field(None, ge=0, description="source file: fee per unit of notional filled, bps, replacing env.taker_fee_bps and env.maker_fee_bps.")

    @model_validator(mode="after")
    def _file_source(self) -> MarketSettings:
        if self.source == "file" and not self.path:
            raise ValueError("source: file needs path")
        if self.source == "file" and self.format == "l1" and not self.trades_path:
            raise ValueError("format: l1 needs trades_path (the trades beside the quotes in path)")
        return self


class EnvSettings(_Strict):
    """The vectorized trading environment (see foxhunt_core.env)."""

    num_envs: int = Field(64, ge=1, description="Parallel episodes in collection.")
    episode_len: int = Field(256, ge=8, description="Bars per training episode.")
    position_sizes: tuple[float, float, float] = Field((0.25, 0.5, 1.0), description="Position size of each magnitude action, as a fraction of max notional.")
    urgency_bars: tuple[int, int, int] = Field((1, 4, 16), description="How many bars a limit order of each urgency action may wait before it is cancelled.")
    taker_fee_bps: float = Field(0.5, ge=0, description="Fee on market-order notional, basis points.")
    maker_fee_bps: float = Field(-0.1, description="Fee on filled limit-order notional, basis points (negative: rebate).")
    reward_scale_bps: float | None = Field(None, gt=0, description="Rewards are PnL in basis points of max notional divided by this; default (null): the training split's per-bar volatility of the mid in bps, so that rewards are in units of a bar's move on any market (an environment built without a market's scale uses 1).")
    fill_base_rate: float = Field(0.6, ge=0, le=1, description="Limit fill probability scale at touch when trades arrive at the normal rate.")


class NetSettings(_Strict):
    """Shapes of the branching dueling C51 network."""

    state_dim: int = Field(50, description="Input width (the feature schema's size).")
    shared_h1: int = Field(256, ge=4, description="First trunk layer width.")
    shared_h2: int = Field(256, ge=4, description="Second trunk layer width (and VSN width).")
    adv_h: int = Field(256, ge=4, description="Width of each advantage branch's GLU layer.")
    num_atoms: int = Field(51, ge=3, description="C51 atoms per distribution.")
    v_min: float = Field(-10.0, description="Lowest atom of the return support.")
    v_max: float = Field(10.0, description="Highest atom of the return support.")
    branch_sizes: tuple[int, int, int, int] = Field((3, 3, 3, 3), description="Actions per branch: direction, magnitude, order, urgency.")
    attn_dim: int = Field(8, ge=1, description="Key/query width of the cross-branch Q attention.")
    init_scale: float = Field(1.0, gt=0, description="Multiplier on the default (He/Glorot) weight initialization.")

    @model_validator(mode="after")
    def _support(self) -> NetSettings:
        if not self.v_min < self.v_max:
            raise ValueError("v_min must be below v_max")
        return self


class TrainSettings(_Strict):
    """The optimisation loop."""

    steps: int = Field(3_000, ge=1, description="Gradient updates in the run.")
    batch_size: int = Field(128, ge=2, description="Transitions per update.")
    lr: float = Field(3e-4, gt=0, description="Adam learning rate.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="Adam beta1, beta2.")
    adam_eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    grad_clip: float = Field(10.0, gt=0, description="Global L2 norm at which gradients are clipped.")
    gamma: float = Field(0.9, ge=0, lt=1, description="Discount factor.")
    target_sync_every: int = Field(250, ge=1, description="Updates between target-network syncs.")
    entropy_coeff: float = Field(0.001, ge=0, description="Base coefficient of the -H(p) term of the C51 loss.")
    aux_weight: float = Field(1.0, ge=0, description="Weight of the coordinated-Q regression loss that trains attention and post-attention stages.")
    replay_capacity: int = Field(100_000, ge=64, description="Transitions kept in the replay buffer.")
    warmup_steps: int = Field(1_000, ge=0, description="Transitions collected with a random policy before the first update.")
    collect_per_update: int = Field(1, ge=1, description="Environment steps (of all parallel envs) per gradient update.")
    stats_every: int = Field(50, ge=1, description="Updates between Q-statistics records (and liquid-tau steps).")
    tau: float = Field(1.0, gt=0, description="Base Boltzmann temperature; per branch it is tau * liquid_mod[d].")
    tau_min: float = Field(0.05, gt=0, description="Floor of the annealed temperature.")
    tau_decay_fraction: float = Field(0.6, gt=0, le=1, description="Share of training over which the temperature anneals from tau to tau_min.")
    liquid_init: float = Field(1.5, ge=0.1, le=2.0, description="Initial liquid_mod of every branch.")
    liquid_dt: float = Field(0.05, gt=0, description="ODE time advanced per liquid-tau step (one stats interval).")
    liquid_tau_min: float = Field(0.01, gt=0, description="Smallest ODE time constant.")
    liquid_tau_max: float = Field(1.0, gt=0, description="Largest ODE time constant.")
    iqn_ramp_fraction: float = Field(0.5, gt=0, le=1, description="Share of training over which iqn_readiness ramps from 0 to 1.")
    atom_mass_threshold: float = Field(0.1, gt=0, lt=1, description="An atom counts as used in a distribution when its probability is at least this / num_atoms.")
    checkpoint_every: int = Field(1_000, ge=1, description="Updates between checkpoints.")
    checkpoint_minutes: float = Field(5.0, ge=0, description="Minutes of training between checkpoints besides checkpoint_every, whichever comes first, so that a crash loses minutes, not the run (0: by updates only).")
    tensorboard: bool = Field(True, description="Write TensorBoard event files (tensorboardX) into the run directory: losses, Q-statistics, plugin signals, evaluation metrics, throughput.")
    gpu_collection: bool = Field(True, description="On the GPU, keep market, environment and replay on the device (off: the CPU environment feeds the GPU agent).")
    cuda_graphs: bool = Field(True, description="On the GPU, capture the update as a CUDA graph and replay it (off: launch eagerly).")
    tf32: bool = Field(True, description="On the GPU, let cuBLAS use TF32 tensor cores for float32 GEMMs.")
    gemm_autotune: bool = Field(True, description="On the GPU, time cuBLASLt's candidate algorithms for each GEMM shape once (during the update's warm-up) and keep the fastest, instead of the heuristic's first (about 7% faster at B = 65536). The choice depends on timing; the run directory records it (gemm_tuning.json) and a resumed run reads it back and repeats the same GEMMs. A fresh run starts from the machine's cache of earlier runs' choices (FOXHUNT_CACHE_DIR, default ~/.cache/foxhunt; FOXHUNT_GEMM_CACHE=0 turns it off), so fresh runs on one machine run the same GEMMs and only shapes new to it are timed.")


class SelectSettings(_Strict):
    """Model selection on the validation split (foxhunt_core.selection)."""

    every: int = Field(500, ge=0, description="Updates between evaluations of the greedy policy on the validation split; the best one's parameters are kept and evaluated on test (0: no selection, the last parameters are evaluated).")
    fallback: Literal["none", "flat"] = Field("none", description="When the selected parameters show no edge on validation (edge_test): none keeps them (the table says no edge was found), flat deploys the flat policy instead.")
    edge_test: Literal["bootstrap", "return"] = Field("bootstrap", description="When the selected parameters have an edge on validation: bootstrap: their validation return is above flat's and the block-bootstrap lower bound (confidence) of their return over each policy of edge_over is above 0 (foxhunt_core.edge); return: their validation return is above flat's.")
    edge_over: tuple[Literal["flat", "buy_and_hold", "linear", "momentum"], ...] = Field(("flat", "buy_and_hold", "linear", "momentum"), min_length=1, description="The reference policies the bootstrap edge test compares the selected parameters with, bar by bar on the validation split.")
    confidence: float = Field(0.95, ge=0.5, lt=1.0, description="One-sided confidence of the bootstrap lower bound (its 1 - confidence quantile).")
    block_bars: int | None = Field(None, ge=1, description="Block length of the bootstrap, in bars; default round(n ** (1/3)) for the n bars of the validation split.")


class RunSettings(_Strict):
    """Everything a run needs besides the plugin set."""

    seed: int = Field(0, description="Seed of initialisation, exploration, replay sampling and episode starts.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Array backend: NumPy on cpu, CuPy on cuda; auto picks cuda when available.")
    market: MarketSettings = Field(default_factory=MarketSettings)
    env: EnvSettings = Field(default_factory=EnvSettings)
    net: NetSettings = Field(default_factory=NetSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    select: SelectSettings = Field(default_factory=SelectSettings)
