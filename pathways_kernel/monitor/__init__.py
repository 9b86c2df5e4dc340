"""The monitor transport: protocol v1 on comm target ``pathways.monitor``, and the notebook widget.

``protocol`` encodes/decodes messages (docs/protocol.md), ``comm`` serves them
from the telemetry hub, ``widget`` is the ipywidgets dashboard of
``%pathways monitor`` / ``pw.monitor()``.
"""
