"""Salus (Yu & Chowdhury): lanes with the safety condition (lanes.py), iteration boundaries seen
from a job's calls (detector.py), iteration-boundary schedulers (schedulers.py) and the `salus`
policy that wires them into pilotd (policy.py)."""
