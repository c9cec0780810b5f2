"""foxhunt plugin ``q_mean_center``: subtract the global mean of expected Q before attention."""

__version__ = "0.1.0"
