"""Client-side Flower mods: wrap an unchanged ``@app.train`` function."""

from flwr_fsl.mods.topk import topk_mod

__all__ = ["topk_mod"]
