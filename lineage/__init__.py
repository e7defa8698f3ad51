"""Lineage: the graph projected from the event log, queries and cost roll-ups."""
