"""foxhunt plugin ``kan_gate``: a learned cubic B-spline gate per GLU unit in place of the sigmoid."""

__version__ = "0.1.0"
