"""foxhunt plugin ``diffusion_refine``: trained variance-conditioned refinement of coordinated Q."""

__version__ = "0.1.0"
