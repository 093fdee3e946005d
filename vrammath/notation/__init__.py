"""The words every other package uses: symbols, units, the named choices, the setup fields'
metadata, and the one input error. Imports nothing of vrammath.
"""
