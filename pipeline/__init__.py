"""ctxprec's flow and public API: the per-row scorer, run_evals, and the batch entry point."""

from pipeline.metric import map_score, map_stage, round_half_up

__all__ = ["map_score", "map_stage", "round_half_up"]
