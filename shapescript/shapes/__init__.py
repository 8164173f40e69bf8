"""The language's vocabulary of types, shared by every stage after parsing: dims (dims.py, sizes as
sympy expressions), the type of each value a program names (value_types.py), and how a call of an
op resolved (options.py: its options, and where broadcast operands' axes go). The checker makes
these; the IR, the plans and lowering read them. Nothing here imports a stage but syntax/.
"""
