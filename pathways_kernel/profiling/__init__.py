"""Profiling: capture a cell's trace, summarize it inline, read it in XProf inside JupyterLab."""
