"""Graph passes (`prepare`): naming, constants, opset, folding, fusions; each one recorded.

They sit above `graph/` (the structural analysis they use) and below `precision/`,
which they never import.
"""
