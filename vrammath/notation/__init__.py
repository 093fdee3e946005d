"""The words every other package uses: symbols, units, the named choices, the setup fields'
metadata, the one input error, and how related functions share one signature. Imports nothing of vrammath.
"""
