"""The runner-set worker: reconciles EphemeralRunnerSets (see docs/runner-set.md)."""
