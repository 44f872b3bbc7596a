"""matplotlib (Agg) figures from the analytic model (`analytic`) and from results
(`measured`)."""
