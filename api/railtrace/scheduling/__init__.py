"""Assembly scheduling: which traces are ready (quiet long enough), which of them belong
together, who holds them (leases shared by replicas and child processes), and when their
summaries are stored. The work itself is `railtrace.assembly` and `railtrace.verdicts`."""
