"""Helpers of the published studies reproduced in ``experiments/`` (see each module)."""
