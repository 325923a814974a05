"""Kiln cost models: features of scheduled loop IR and learned latency predictors."""
