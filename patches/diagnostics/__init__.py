"""Opt-in reports printed during a run (``ADAPTOR_REPORT_MEMORY``)."""
