"""foxhunt plugin ``rk4_tau``: a sub-stepped RK4 liquid-tau step while the xLSTM context is large."""

__version__ = "0.1.0"
