"""The answers built on the one composition: budgets, inverse problems, fit, the cheapest plan,
sweeps, formula access, the papers' claims, mixture-of-experts layouts, and the report that
renders estimates as text and JSON.
"""
