"""Human-readable reports: export report, configuration summaries, final pipeline report."""
