"""pplan: plan, simulate and run pipeline-parallel training of PyTorch models.

The library never imports typer, and imports torch or matplotlib only in the modules that
measure, execute or draw, so planning and simulation start fast.
"""

__version__ = "0.1.0"
