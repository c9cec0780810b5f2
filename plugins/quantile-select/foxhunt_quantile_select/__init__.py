"""foxhunt plugin ``quantile_select``: collection chooses by a readiness-blended pair of quantiles."""

__version__ = "0.1.0"
