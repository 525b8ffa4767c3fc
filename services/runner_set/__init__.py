"""The runner-set worker: reconciles EphemeralRunnerSets (see README "runner-set worker")."""
