"""foxhunt plugin ``graph_message``: gated message passing between the four branches' Q-values."""

__version__ = "0.1.0"
