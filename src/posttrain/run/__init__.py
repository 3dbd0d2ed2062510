"""Run infrastructure every entry shares: the run session (session.py: config, preflight, run
directory, admission, resume, sinks, eval/save timing, signals, progress), the run directory's
lock, signals, the user-error boundary and the run's records (resolved config, samples, data
fingerprints)."""
