"""Run infrastructure every entry shares: the run directory's lock, signals, the user-error
boundary and the run's records (resolved config, samples)."""
