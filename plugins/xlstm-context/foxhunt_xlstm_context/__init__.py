"""foxhunt plugin ``xlstm_context``: a stabilized, online-trained mLSTM context over the Q-statistics."""

__version__ = "0.1.0"
