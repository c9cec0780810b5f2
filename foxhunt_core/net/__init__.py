"""The branching dueling C51 network (parameters, layers, forward and backward)."""

from .network import BranchingC51, NetOutput, ParamTree, SigmoidGate

__all__ = ["BranchingC51", "NetOutput", "ParamTree", "SigmoidGate"]
