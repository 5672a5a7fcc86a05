"""triage: is it the node or the job? GPU training failure triage."""

__version__ = "0.1.0"
