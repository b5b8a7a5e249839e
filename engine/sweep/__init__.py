"""Sweeps on Ray Tune: a sweep file (spec), its search space (space), the trial
(trial), the child process that runs Tune and streams events (runner), where
it runs: addresses, reaching a cluster, starting or joining Ray (connect), the
same sweep submitted to a cluster as a Ray job (job), starting and ending it
(launch), and the table of trials from its events (events)."""
