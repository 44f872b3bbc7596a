"""Running scenario points through the engine and measuring them: workloads, metrics,
traffic accounting, predictions for the same point, telemetry, calibration, kernel bench."""
