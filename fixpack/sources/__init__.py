"""Release sources: wheels and git commits as cached scratch trees (sources), and the runs on them
that make manifests and locks (release)."""
