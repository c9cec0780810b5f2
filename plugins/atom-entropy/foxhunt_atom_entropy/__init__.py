"""foxhunt plugin ``atom_entropy``: adaptive entropy coefficient driven by an atom-utilization EMA."""

__version__ = "0.1.0"
