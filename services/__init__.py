"""One package per runnerscale process (workers and the embedded-default simulators)."""
