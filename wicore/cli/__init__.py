"""The command lines, on top of every other package: `wicore` (main.py) and `wicore-export` (export.py)."""
