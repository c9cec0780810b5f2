"""foxhunt plugin ``tlob_inject``: microstructure features as extra inputs of the order and urgency branches."""

__version__ = "0.1.0"
