"""foxhunt core: the engine that trains branching dueling C51 trading agents."""

__version__ = "0.1.0"
